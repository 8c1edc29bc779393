"""The Ascend quantization operators and the int8 cube, as the device computes them.

A quantized Conv2D / MatMul appears in the IR (after ``quantization.deploy.quantized_graph``, or read
from a deploy MindIR) as

    Quant(x) -> int8  ->  Conv2D / MatMul (int8 weight, int32 bias, ``offset_x``) -> int32  ->  Dequant -> float16

Each lowers two ways: for the ``device`` target as the ONNX deploy operators atc compiles
(AscendQuant, Conv/Gemm on int8, AscendDequant), otherwise as the arithmetic the device performs
(there the int8 tensor between Quant and the cube is carried as uint8 ``q + 128``):

- Quant: ``q = saturate_int8(round_half_even(fp16(fp16(x * fp16(scale)) + fp16(offset))))``.
  TBE ascend_quant.py (ascend_quant_compute -> _compute_scale / _compute_offset, CANN 8.1.RC1): cast
  to float16, multiply by tvm.const(scale, "float16"), add the float16 offset, cast to int8 with the
  "Round" mode; op_proto quantize_ops.h documents "Round" as "round to nearest, tie to even (c
  language rint)", and the conversion saturates (Ascend C precision_conversion.md).
- cube: ``acc = sum(w_q * (q - offset_x)) + bias`` exact in int32.  On Ascend310P the cube subtracts
  the offset itself (conv_compute.py: sum((fmap - offset_x) * weight) on v200 SoCs); padding
  contributes 0.  Two exact lowerings:
  * a float32 Conv on the integers ``q - offset_x`` and ``w_q``, exact while every partial sum stays
    below 2**24 (``sum|w_q[c]| * 255 < 2**24``, checked per layer).  Preferred for convolutions:
    onnxruntime runs it in its NCHWc layout, measured as fast as or faster than ConvInteger here
    (DigitsNet 0.63 vs 0.98 ms per batch of 32), and ConvInteger has no grouped kernel (~3x slower on
    MobileNet's depthwise layers);
  * onnxruntime's ConvInteger / MatMulInteger on uint8 operands (``q + 128`` with zero point
    ``offset_x + 128``, ``w_q + 128`` with zero point 128): integer arithmetic in int32, padding with
    the zero point.  For matrix products and for convolutions beyond float32's exact range.  uint8 x
    uint8 because MLAS's u8u8 kernels widen to 16 bits before multiplying (no pair saturation, which
    the u8s8 path risks on AVX2 without VNNI).
  A layer whose accumulator could leave int32 (``sum|w_q[c]| * 255 + |bias| >= 2**31``) is refused.
- Dequant: ``y = fp16(relu?(float32(acc) * deq_scale[c]))``, deq_scale's low 32 bits read as float32
  (ascend_dequant.py: vdeq_cast with a uint64 per-channel scale on v200 SoCs).
"""
from __future__ import annotations

import copy

import numpy as np
from onnx import TensorProto

from ..errors import UnsupportedNetworkError
from .registry import OpDef, register

INT32_LIMIT = 2 ** 31
FLOAT32_EXACT = 2 ** 24
ZERO_SHIFT = 128  # int8 value + 128 = the uint8 operand of ConvInteger / MatMulInteger


def round16(b, x: str, out: str | None = None) -> str:
    """float32 -> nearest float16 (ties to even) -> float32."""
    return b.add("Cast", [b.add("Cast", [x], to=TensorProto.FLOAT16)], out, to=TensorProto.FLOAT)


# ----------------------------------------------------------------------------- Quant (AscendQuant)

def _quant_from_mindir(ctx):
    if ctx.attr("sqrt_mode", False):
        ctx.fail("Quant with sqrt_mode")
    if ctx.attr("round_mode", "Round") != "Round":
        ctx.fail(f"Quant with round_mode {ctx.attr('round_mode')!r} (only 'Round' is emulated)")
    return [ctx.tensor(0)], {"scale": float(ctx.attr("scale")), "offset": float(ctx.attr("offset"))}


def _quant_onnx(node, b):
    a = node.attrs
    if b.target == "device":
        # no dst_type: CANN's 2022 ONNX plugin does not read it, the 2025 one reads it as a string defaulting to
        # INT8 (ascend_quant_plugin.cc; ops-nn ascend_quant_onnx_plugin.cpp), and msmodelslim writes none
        b.add("AscendQuant", node.inputs, node.outputs[0], scale=float(np.float32(a["scale"])),
              offset=float(a["offset"]), sqrt_mode=0, round_mode="Round")
        return
    scale = b.const(np.float32(np.float16(np.float32(a["scale"]))), "quant_scale")
    offset = b.const(np.float32(np.float16(a["offset"])), "quant_offset")
    t = round16(b, b.add("Add", [round16(b, b.add("Mul", [node.inputs[0], scale])), offset]))
    # carried as uint8 q + 128, the operand the cube lowering below hands to onnxruntime: QuantizeLinear
    # with scale 1 and zero point 128 is saturate(round_half_even(t) + 128) in one step (ONNX spec)
    b.add("QuantizeLinear", [t, b.const(np.float32(1), "unit_scale"), b.const(np.uint8(ZERO_SHIFT), "zero_shift")],
          node.outputs[0])


def _quant_ms(node, w):
    quant = w.prim("Quant(%r, %r, False, 'Round')" % (node.attrs["scale"], node.attrs["offset"]))
    x = w.x(node, 0)
    cube = w.reader_of(node.outputs[0])
    if cube.op == "MatMul":  # written as a 1x1 Conv2D (ops.nn): the reshape on the float side of the Quant
        x = f"{w.prim('ops.Reshape()')}({x}, (-1, {w.graph.shape(node.inputs[0])[-1]}, 1, 1))"
    return f"{quant}({x})"


register(OpDef("Quant", _quant_from_mindir, _quant_onnx, rounds_itself=True, to_mindspore=_quant_ms))


# ----------------------------------------------------------------------------- Dequant (AscendDequant)

def _dequant_from_mindir(ctx):
    if ctx.attr("sqrt_mode", False):
        ctx.fail("Dequant with sqrt_mode")
    return [ctx.tensor(0), ctx.tensor(1)], {"relu_flag": bool(ctx.attr("relu_flag", False)),
                                            "rank": len(ctx.shape(ctx.tensor(0)))}


def deq_scale_float32(deq: np.ndarray, where: str) -> np.ndarray:
    deq = np.asarray(deq)
    if deq.dtype != np.uint64 or np.any(deq >> np.uint64(32)):
        raise UnsupportedNetworkError(f"{where}: deq_scale must be uint64 with the high 32 bits zero")
    return (deq & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)


def _dequant_onnx(node, b):
    a = node.attrs
    if b.target == "device":
        b.add("AscendDequant", node.inputs, node.outputs[0], sqrt_mode=0, relu_flag=int(a["relu_flag"]), dtype=0)
        return
    shape = [1] * a["rank"]
    shape[1 if a["rank"] > 1 else 0] = -1
    scale = deq_scale_float32(b.initializers[node.inputs[1]], node.label)
    # DequantizeLinear on int32: float32(acc) * scale[c], the Cast and Mul of the formula in one node
    if scale.size == 1:
        scale = scale.reshape(())
    y = b.add("DequantizeLinear", [node.inputs[0], b.const(scale, "deq_scale"),
                                   b.const(np.zeros(scale.shape, np.int32), "deq_zero")], axis=shape.index(-1))
    if a["relu_flag"]:
        y = b.add("Relu", [y])
    round16(b, y, node.outputs[0])


def _dequant_ms(node, w):
    deq = w.prim("Dequant(False, %s)" % bool(node.attrs["relu_flag"]))
    y = f"{deq}({w.x(node, 0)}, {w.x(node, 1)})"
    if w.producer_of(node.inputs[0]).op == "MatMul":  # back from the 1x1 Conv2D's (N, C, 1, 1), on the float side
        y = f"{w.prim('ops.Reshape()')}({y}, (-1, {w.graph.shape(node.outputs[0])[-1]}))"
    return y


register(OpDef("Dequant", _dequant_from_mindir, _dequant_onnx, rounds_itself=True, to_mindspore=_dequant_ms))


# ----------------------------------------------------------------------------- the int8 cube

def device_offset_x(nodes, x: str) -> int:
    """The ``offset_x`` the device gives an int8 convolution reading ``x`` (``nodes``: the IR nodes before it):
    CANN's Conv2D quant pass copies ``int8(AscendQuant.offset)`` into the cube's offset_x where AscendQuant ->
    Conv2D (a Pad may sit between) are adjacent (bias_optimize_quant_rollback_base.cc ``SetQuantParameters``;
    conv2d_quant_process_fusion_pass.cc ``DefinePatterns``); anywhere else offset_x stays 0.  A deploy network
    read back (MindSpore drops Conv2D's own ``offset_a`` in its GE adapter) gets the offset the device sets."""
    producer = {o: n for n in nodes for o in n.outputs}
    node = producer.get(x)
    if node is not None and node.op == "Pad":
        node = producer.get(node.inputs[0])
    return int(node.attrs["offset"]) if node is not None and node.op == "Quant" else 0



def int8_cube_onnx(node, b, integer_lowering, float_lowering=None) -> None:
    """What Conv2D / MatMul on int8 input and weight (``node.attrs['offset_x']``), int32 (+ bias) output computes
    (the deploy graph's own form of the cube is its op's: ops.nn).

    ``integer_lowering(b, x, w, x_zero, w_zero) -> name``: the op as ConvInteger / MatMulInteger on the
    uint8 input ``x``, the uint8 weight array ``w`` (IR layout) and the two uint8 zero-point constants.
    ``float_lowering(sub_node, b)``, when given, is used instead where float32 is exact (module doc)."""
    x, w = node.inputs[:2]
    bias = node.inputs[2] if len(node.inputs) == 3 else None
    w_q = b.initializers[w]
    axis = node.attrs["channel_axis"]
    per_channel = np.abs(np.moveaxis(w_q.astype(np.int64), axis, 0)).reshape(w_q.shape[axis], -1).sum(axis=1)
    bias_q = b.initializers[bias].astype(np.int64).reshape(-1) if bias else np.zeros(1, np.int64)
    worst = int((per_channel * 255 + np.abs(bias_q)).max())
    if worst >= INT32_LIMIT:
        raise UnsupportedNetworkError(f"layer {node.label}: a channel's accumulator can reach {worst}, beyond int32 "
                                      f"(sum of |int8 weights| x 255 + |bias|)")
    if float_lowering is not None and (per_channel * 255 + np.abs(bias_q)).max() < FLOAT32_EXACT:
        # the integers q - offset_x (DequantizeLinear with scale 1: the uint8 operand minus its zero point),
        # convolved in float32 with the bias as the op's own: every partial sum an exact integer
        sub = copy.copy(node)
        v = b.add("DequantizeLinear", [x, b.const(np.float32(1), "unit_scale"),
                                       b.const(np.uint8(node.attrs["offset_x"] + ZERO_SHIFT), "x_zero")])
        sub.inputs = [v, b.const(w_q.astype(np.float32), "weight_q")]
        if bias:
            sub.inputs.append(b.const(b.initializers[bias].astype(np.float32).reshape(-1), "bias_q"))
        sub.outputs = [b.fresh("acc")]
        float_lowering(sub, b)
        b.add("Cast", [sub.outputs[0]], node.outputs[0], to=TensorProto.INT32)
        return
    acc = integer_lowering(b, x, (w_q.astype(np.int16) + ZERO_SHIFT).astype(np.uint8),
                           b.const(np.uint8(node.attrs["offset_x"] + ZERO_SHIFT), "x_zero"),
                           b.const(np.uint8(ZERO_SHIFT), "w_zero"))
    if bias is None:
        b.add("Identity", [acc], node.outputs[0])
        return
    rank = node.attrs.get("out_rank", 4 if node.op == "Conv2D" else 2)
    shape = [1] * rank
    shape[1 if rank > 1 else 0] = -1
    b.add("Add", [acc, b.const(b.initializers[bias].astype(np.int32).reshape(shape), "bias_q")], node.outputs[0])
