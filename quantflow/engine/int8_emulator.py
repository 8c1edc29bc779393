"""INT8 emulation of what the Ascend device computes for the quantized graph.

The emulation is an onnxruntime graph built from the (BatchNorm-folded) IR and the qparams:

- every quantized Conv2D / MatMul becomes
  AscendQuant   t = fp16(fp16(x * fp16(1/scale_d)) + fp16(offset_d)); q = clip(round(t), -128, 127)
  cube          acc = sum(w_q * (q - offset_d)) + bias_q          (exact integers, int32)
  AscendDequant y = fp16(relu?(float32(acc) * deq_scale[c]))
- every other op runs as the deploy graph lowers it (opset 13, the same registry lowering): each
  ONNX operation on float16 values and float16-rounded constants, computed in float32, its output
  rounded to float16.

The cube's integer sums are computed by float32 convolutions, which are exact while every
partial sum stays below 2**24: ``sum|w_q[c]| * 255 < 2**24`` is checked per layer; a layer
beyond it splits ``q - offset_d`` into two base-16 digits (two exact convolutions, combined in
int32); a layer beyond that too is refused.  onnxruntime's graph optimizations are off so that
no float16 rounding step is fused away.
"""
from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import TensorProto

from ..errors import UnsupportedNetworkError
from ..ir import Graph, Node
from ..ops import get as get_op
from ..quantization import scheme
from ..quantization.qparams import QuantizedOp, QuantParams
from .float_runner import Runner
from .onnx_builder import DEVICE_OPSET, OnnxBuilder

EXACT_LIMIT = 2 ** 24


def round16(b: OnnxBuilder, x: str, out: str | None = None) -> str:
    """float32 -> nearest float16 (ties to even) -> float32."""
    return b.add("Cast", [b.add("Cast", [x], to=TensorProto.FLOAT16)], out, to=TensorProto.FLOAT)


def _channel_shape(q: QuantizedOp, rank: int) -> list[int]:
    shape = [1] * rank
    shape[1 if q.op == "Conv2D" or rank > 1 else 0] = -1
    return shape


def _ascend_quant(b: OnnxBuilder, x: str, q: QuantizedOp) -> str:
    """AscendQuant in float16 with round mode "Round", then the zero point taken off: q - offset_d.

    TBE ascend_quant.py (ascend_quant_compute -> _compute_scale / _compute_offset, CANN 8.1.RC1):
    cast to float16, multiply by tvm.const(scale, "float16"), add the float16 offset, cast to int8
    with the "Round" mode; op_proto quantize_ops.h documents "Round" as "round to nearest, tie to
    even (c language rint)", and the conversion saturates to [-128, 127] (Ascend C
    precision_conversion.md).  ONNX Round is half to even too.  The cube subtracts the offset
    itself on Ascend310P (conv_compute.py: sum((fmap - offset_x) * weight) on v200 SoCs), so the
    bias needs no offset correction.
    """
    inv = b.const(np.float32(np.float16(scheme.quant_scale(q.scale_d))), "quant_scale")
    off = b.const(np.float32(np.float16(q.offset_d)), "quant_offset")
    t = round16(b, b.add("Add", [round16(b, b.add("Mul", [x, inv])), off]))
    qv = b.add("Clip", [b.add("Round", [t]), b.const(np.float32(-128), "qmin"), b.const(np.float32(127), "qmax")])
    return b.add("Sub", [qv, b.const(np.float32(q.offset_d), "offset_d")])


def _cube(b: OnnxBuilder, node: Node, q: QuantizedOp, v: str) -> str:
    """The int32 accumulator sum(w_q * v) for integer-valued float32 ``v`` in [-255, 255]."""
    wname = b.const(q.weight.astype(np.float32), "weight_q")
    per_channel = np.abs(np.moveaxis(q.weight.astype(np.int64), q.channel_axis, 0)).reshape(
        q.weight.shape[q.channel_axis], -1).sum(axis=1).max()

    def product(inp: str) -> str:
        sub = copy.copy(node)
        sub.inputs, sub.outputs = [inp, wname], [b.fresh("acc")]
        get_op(node.op, node.name).to_onnx(sub, b)
        return b.add("Cast", [sub.outputs[0]], to=TensorProto.INT32)

    if per_channel * 255 < EXACT_LIMIT:
        return product(v)
    if per_channel * 16 < EXACT_LIMIT:
        sixteen = b.const(np.float32(16), "sixteen")
        hi = b.add("Floor", [b.add("Div", [v, sixteen])])
        lo = b.add("Sub", [v, b.add("Mul", [hi, sixteen])])
        return b.add("Add", [b.add("Mul", [product(hi), b.const(np.int32(16), "sixteen_i")]), product(lo)])
    raise UnsupportedNetworkError(
        f"layer {q.scope}: a channel's sum of |int8 weights| is {per_channel}, too large for exact int32 "
        f"emulation of its accumulator")


def _quantized(b: OnnxBuilder, graph: Graph, node: Node, q: QuantizedOp) -> None:
    rank = len(graph.shape(node.outputs[0]))
    shape = np.array(_channel_shape(q, rank), np.int64)
    acc = _cube(b, node, q, _ascend_quant(b, node.inputs[0], q))
    bias = b.const(q.bias.astype(np.int32).reshape(shape), "bias_q")
    acc = b.add("Add", [acc, bias])
    y = b.add("Mul", [b.add("Cast", [acc], to=TensorProto.FLOAT),
                      b.const(q.deq_scale.astype(np.float32).reshape(shape), "deq_scale")])
    if q.relu:
        y = b.add("Relu", [y])
    round16(b, y, node.outputs[0])


def _float16_node(b: OnnxBuilder, node: Node) -> None:
    """The node's device lowering, every ONNX operation in it on float16 values (rounded after each)."""
    first = len(b.nodes)
    get_op(node.op, node.name).to_onnx(node, b)
    lowered = b.nodes[first:]
    del b.nodes[first:]
    for n in lowered:
        outs = list(n.output)
        n.output[:] = [b.fresh("f32") for _ in outs]
        b.nodes.append(n)
        for tmp, out in zip(n.output, outs):
            round16(b, tmp, out)


def emulation_model(graph: Graph, qparams: QuantParams) -> onnx.ModelProto:
    qmap = qparams.by_node()
    missing = [n for n in qmap if not any(x.name == n for x in graph.nodes)]
    if missing:
        raise UnsupportedNetworkError(f"quantization parameters name node(s) not in the graph: {', '.join(missing)}")
    b = OnnxBuilder(f"{graph.name}_int8_emulation", opset=DEVICE_OPSET)
    float_inits = {i for n in graph.nodes if n.name not in qmap for i in n.inputs if i in graph.initializers}
    for k in float_inits:
        v = graph.initializers[k]
        b.initializer(k, v.astype(np.float16).astype(np.float32) if v.dtype == np.float32 else v)
    inp = graph.inputs[0]
    b.nodes.append(onnx.helper.make_node("Identity", ["input"], [inp]))
    for node in graph.nodes:
        if node.name in qmap:
            _quantized(b, graph, node, qmap[node.name])
        else:
            _float16_node(b, node)
    return b.model([("input", graph.tensors[inp].shape, "float32")], [(o, graph.shape(o), "float32") for o in graph.outputs])


class Emulator(Runner):
    """Runs the emulation on float16-valued inputs (the AIPP output)."""

    def __init__(self, graph: Graph, qparams: QuantParams):
        super().__init__(emulation_model(graph, qparams), "input", graph.tensors[graph.inputs[0]].shape[0],
                         optimize=False)
        self.graph = graph

    def logits(self, x16: np.ndarray) -> np.ndarray:
        return self.run(np.asarray(x16, np.float16).astype(np.float32))[self.graph.outputs[0]]
