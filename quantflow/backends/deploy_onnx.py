"""The Ascend INT8 deploy graph as ONNX: what atc compiles to INT8 kernels (``--framework=5``).

The form AMCT's deploy model takes: every quantized Conv2D / MatMul becomes

    AscendQuant(x; scale = 1/scale_d, offset = offset_d, sqrt_mode = 0, round_mode = "Round", dst_type = 2)
      -> Conv (int8 input, INT8 weight initializer, INT32 bias initializer)      | Gemm for MatMul
      -> AscendDequant(acc, deq_scale; sqrt_mode = 0, relu_flag, dtype = 0)   deq_scale: UINT64 per channel

with the deq_scale's low 32 bits the float32 bits of scale_d * scale_w[c] and the high 32 bits 0;
the rest of the graph is ordinary float ONNX (opset 13, default domain for every op, as atc reads it).
The graph input is named ``model.input_name`` so that ``atc --input_shape`` can name it.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import defs

from ..engine.onnx_builder import DEVICE_OPSET, OnnxBuilder
from ..ir import Graph, Node
from ..ops import get as get_op
from ..quantization.qparams import QuantizedOp, QuantParams
from ..quantization.scheme import deq_scale_uint64, quant_scale

INT8 = 2        # GE DataType DT_INT8, AscendQuant's dst_type


def register_ascend_schemas() -> None:
    """Declare AscendQuant / AscendDequant to the onnx package, so that onnx.checker accepts the graph."""
    S = defs.OpSchema
    if not defs.has("AscendQuant"):
        defs.register_schema(S(
            "AscendQuant", "", 1, doc="Ascend: float -> int8, round(x * scale + offset) in float16",
            inputs=[S.FormalParameter("x", "T")], outputs=[S.FormalParameter("y", "tensor(int8)")],
            type_constraints=[("T", ["tensor(float)", "tensor(float16)"], "float input")],
            attributes=[S.Attribute("scale", S.AttrType.FLOAT, ""), S.Attribute("offset", S.AttrType.FLOAT, ""),
                        S.Attribute("sqrt_mode", S.AttrType.INT, ""), S.Attribute("round_mode", S.AttrType.STRING, ""),
                        S.Attribute("dst_type", S.AttrType.INT, "")]))
    if not defs.has("AscendDequant"):
        defs.register_schema(S(
            "AscendDequant", "", 1, doc="Ascend: int32 accumulator * per-channel deq_scale (uint64) -> float",
            inputs=[S.FormalParameter("x", "tensor(int32)"), S.FormalParameter("deq_scale", "tensor(uint64)")],
            outputs=[S.FormalParameter("y", "T")],
            type_constraints=[("T", ["tensor(float)", "tensor(float16)"], "float output")],
            attributes=[S.Attribute("sqrt_mode", S.AttrType.INT, ""), S.Attribute("relu_flag", S.AttrType.INT, ""),
                        S.Attribute("dtype", S.AttrType.INT, "")]))


def _quantized(b: OnnxBuilder, graph: Graph, node: Node, q: QuantizedOp) -> None:
    layer = q.scope
    x = b.add("AscendQuant", [node.inputs[0]], b.fresh("quant"), scale=float(quant_scale(q.scale_d)),
              offset=float(q.offset_d), sqrt_mode=0, round_mode="Round", dst_type=INT8)
    w = b.initializer(f"{layer}.weight_int8", q.weight.astype(np.int8))
    bias = b.initializer(f"{layer}.bias_int32", q.bias.astype(np.int32))
    acc = b.fresh("acc")
    if node.op == "Conv2D":
        a = node.attrs
        b.nodes.append(onnx.helper.make_node("Conv", [x, w, bias], [acc], name=layer, pads=a["pads"],
                                             strides=a["strides"], dilations=a["dilations"], group=a["group"]))
    else:
        b.nodes.append(onnx.helper.make_node("Gemm", [x, w, bias], [acc], name=layer,
                                             transB=int(bool(node.attrs["transpose_b"]))))
    deq = b.initializer(f"{layer}.deq_scale", deq_scale_uint64(q.deq_scale))
    b.add("AscendDequant", [acc, deq], node.outputs[0], sqrt_mode=0, relu_flag=int(q.relu), dtype=0)


def deploy_model(graph: Graph, qparams: QuantParams, input_name: str) -> onnx.ModelProto:
    """The deploy graph of the (BatchNorm-folded) ``graph`` with ``qparams``."""
    register_ascend_schemas()
    qmap = qparams.by_node()
    b = OnnxBuilder(f"{graph.name}_ascend_int8", opset=DEVICE_OPSET)
    for k in {i for n in graph.nodes if n.name not in qmap for i in n.inputs if i in graph.initializers}:
        b.initializer(k, graph.initializers[k])
    inp = graph.inputs[0]
    b.add("Identity", [input_name], inp)
    for node in graph.nodes:
        if node.name in qmap:
            _quantized(b, graph, node, qmap[node.name])
        else:
            get_op(node.op, node.name).to_onnx(node, b)
    return b.model([(input_name, graph.tensors[inp].shape, "float32")], [(o, graph.shape(o), "float32") for o in graph.outputs])


def check_deploy(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx.checker and shape inference over the deploy graph; returns the model with inferred shapes."""
    register_ascend_schemas()
    onnx.checker.check_model(model)
    return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)


# ----------------------------------------------------------------------------- AMCT record file

def record_text(graph: Graph, qparams: QuantParams) -> str:
    """AMCT's quantization record (text protobuf), one ``record`` per quantized layer, keyed by its
    deploy-graph node name; channels/height/width describe the layer's input."""
    out = []
    for q in qparams.ops:
        shape = graph.shape(q.input)
        c, h, w = (shape[1], shape[2], shape[3]) if len(shape) == 4 else (shape[-1], 1, 1)
        lines = [f'record {{', f'  key: "{q.scope}"', '  value {', f'    scale_d: {q.scale_d:.9g}',
                 f'    offset_d: {q.offset_d}']
        lines += [f"    scale_w: {s:.9g}" for s in q.scale_w]
        lines += ["    offset_w: 0" for _ in q.scale_w]
        lines += [f"    channels: {c}", f"    height: {h}", f"    width: {w}", "  }", "}"]
        out.append("\n".join(lines))
    return "\n".join(out) + "\n"
