"""An interpreter of the Ascend deploy ONNX graph, written from the deploy format's specification.

AscendQuant, AscendDequant and the int8 Conv/Gemm between them are implemented here in NumPy (the
cube subtracts the producing AscendQuant's offset, as Ascend310P's cube applies ``offset_x``); every
other node runs alone in onnxruntime on float16 values, its output rounded to float16, as the device
runs the float part of the graph.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from support import ascend_reference as ref

F16, F32 = np.float16, np.float32


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def ascend_quant(x, a) -> np.ndarray:
    assert a["sqrt_mode"] == 0 and a["round_mode"] == b"Round" and "dst_type" not in a
    t = (x.astype(F16) * F16(F32(a["scale"]))).astype(F16)
    t = (t + F16(a["offset"])).astype(F16)
    return np.clip(np.rint(t.astype(np.float64)), -128, 127).astype(np.int8)


def unpack_deq_scale(deq: np.ndarray) -> np.ndarray:
    assert deq.dtype == np.uint64 and np.all(deq >> np.uint64(32) == 0), "deq_scale high word must be 0"
    return (deq & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(F32)


def ascend_dequant(acc, deq, a) -> np.ndarray:
    assert a["sqrt_mode"] == 0 and a["dtype"] == 0 and acc.dtype == np.int32
    scale = unpack_deq_scale(deq)
    shape = [1] * acc.ndim
    shape[1] = -1
    y = acc.astype(F32) * scale.reshape(shape)
    if a["relu_flag"]:
        y = np.maximum(y, F32(0))
    return y.astype(F16).astype(F32)


def int8_conv(q, w, b, a, offset) -> np.ndarray:
    v = q.astype(np.int64) - offset
    pads = a.get("pads", [0, 0, 0, 0])
    acc = ref.conv_int(v, w, a.get("strides", [1, 1]), (pads[0], pads[1], pads[2], pads[3]),
                       a.get("dilations", [1, 1]), a.get("group", 1))
    return _int32(acc + b.astype(np.int64).reshape(1, -1, 1, 1))


def int8_gemm(q, w, b, a, offset) -> np.ndarray:
    wm = w.astype(np.int64)
    return _int32((q.astype(np.int64) - offset) @ (wm.T if a.get("transB", 0) else wm) + b.astype(np.int64))


def _offset_x(producers: dict, cube) -> int:
    """The cube's input zero point as CANN sets it: the offset of the AscendQuant right before it (a Pad may sit
    between); 0 otherwise (no pattern, no offset_x)."""
    node = producers.get(cube.input[0])
    if node is not None and node.op_type == "Pad":
        node = producers.get(node.input[0])
    return int(_attrs(node)["offset"]) if node is not None and node.op_type == "AscendQuant" else 0


def _int32(acc: np.ndarray) -> np.ndarray:
    assert np.abs(acc).max() < 2 ** 31, "int32 accumulator overflow"
    return acc.astype(np.int32)


def _float_node(node, inputs: list[np.ndarray], constant: list[bool], opset: int) -> list[np.ndarray]:
    """One float node alone in onnxruntime (``inputs``: its non-empty inputs, in order; ``constant``: which of them
    are the deploy graph's initializers, given to onnxruntime as initializers too).  onnxruntime's optimizations
    run as in the emulation: a float convolution (a layer CANN rolls back) then takes the same kernel, hence the
    same float32 accumulation order (the device's own order is not known: docs/device-arithmetic.md)."""
    import onnxruntime as ort

    names = [f"in{i}" for i in range(len(inputs))]
    it = iter(names)
    wired = [next(it) if i else "" for i in node.input]
    feeds = {n: v for n, v, c in zip(names, inputs, constant) if not c}
    consts = [numpy_helper.from_array(v, n) for n, v, c in zip(names, inputs, constant) if c]
    single = helper.make_node(node.op_type, wired, list(node.output), **_attrs(node))
    graph = helper.make_graph([single], "one", [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
        for n, v in feeds.items()], [helper.make_empty_tensor_value_info(o) for o in node.output], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    return [o.astype(F16).astype(F32) if o.dtype == F32 else o for o in outs]


def run(model: onnx.ModelProto, x16: np.ndarray, others: dict | None = None) -> list[np.ndarray]:
    """The deploy graph's outputs for float16 input ``x16`` (one static batch); ``others``: the graph's other
    inputs by name, each computed in float16 as the device computes a float input."""
    g = model.graph
    opset = model.opset_import[0].version
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    producers = {o: n for n in g.node for o in n.output}
    quantized_inputs = {i for n in g.node if n.op_type in ("Conv", "Gemm")
                        for i in n.input[1:] if i in inits and inits[i].dtype in (np.int8, np.int32)}
    env = {g.input[0].name: np.asarray(x16, F16).astype(F32)}
    env.update({k: np.asarray(v, F16).astype(F32) for k, v in (others or {}).items()})
    for k, v in inits.items():
        env[k] = v.astype(F16).astype(F32) if v.dtype == F32 and k not in quantized_inputs else v
    for node in g.node:
        a = _attrs(node)
        ins = [env[i] for i in node.input if i]
        if node.op_type == "AscendQuant":
            outs = [ascend_quant(ins[0], a)]
        elif node.op_type == "AscendDequant":
            outs = [ascend_dequant(ins[0], ins[1], a)]
        elif node.op_type in ("Conv", "Gemm") and ins[0].dtype == np.int8:
            offset = _offset_x(producers, node)
            fn = int8_conv if node.op_type == "Conv" else int8_gemm
            outs = [fn(ins[0], ins[1], ins[2], a, offset)]
        else:
            outs = _float_node(node, ins, [i in inits for i in node.input if i], opset)
        env.update(zip(node.output, outs))
    return [env[o.name] for o in g.output]
