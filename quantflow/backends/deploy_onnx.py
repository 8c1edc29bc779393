"""The Ascend INT8 deploy graph as ONNX: what atc compiles to INT8 kernels (``--framework=5``), and AMCT's
quantization record.

The form AMCT's and msmodelslim's ONNX deploy models take: every INT8 Conv2D / MatMul becomes

    AscendQuant(x; scale = 1/scale_d, offset = offset_d, sqrt_mode = 0, round_mode = "Round")
      -> Conv (int8 input, INT8 weight, INT32 bias; kernel_shape)   | Gemm (transB = 0, INT8 weight [K, N]) for MatMul
      -> AscendDequant(acc, deq_scale; sqrt_mode = 0, relu_flag, dtype = 0)   deq_scale: UINT64 per channel

adjacent, as CANN's quant passes need them (quantflow.ops.quant / ops.nn say which source asks for what); the
deq_scale's low 32 bits are the float32 bits of scale_d * scale_w[c], the high 32 bits 0; the rest of the graph
is ordinary float ONNX (opset 13, default domain for every op, as atc reads it).  Nodes are named by their IR
layer (its MindSpore scope, or the ONNX source's node name).  The image input is named ``model.input_name`` so
that ``atc --input_shape`` can name it; the other inputs (``model.inputs``) follow it under their own names, and
the source model's constant outputs follow the others (``Graph.constant_outputs``).
"""
from __future__ import annotations

import onnx
from onnx import defs

from ..engine.lowering import lower
from ..ir import Graph
from ..quantization.qparams import QuantParams


def register_ascend_schemas() -> None:
    """Declare AscendQuant / AscendDequant to the onnx package, so that onnx.checker accepts the graph."""
    S = defs.OpSchema
    if not defs.has("AscendQuant"):
        defs.register_schema(S(
            "AscendQuant", "", 1, doc="Ascend: float -> int8, round(x * scale + offset) in float16",
            inputs=[S.FormalParameter("x", "T")], outputs=[S.FormalParameter("y", "tensor(int8)")],
            type_constraints=[("T", ["tensor(float)", "tensor(float16)"], "float input")],
            attributes=[S.Attribute("scale", S.AttrType.FLOAT, ""), S.Attribute("offset", S.AttrType.FLOAT, ""),
                        S.Attribute("sqrt_mode", S.AttrType.INT, ""), S.Attribute("round_mode", S.AttrType.STRING, "")]))
    if not defs.has("AscendDequant"):
        defs.register_schema(S(
            "AscendDequant", "", 1, doc="Ascend: int32 accumulator * per-channel deq_scale (uint64) -> float",
            inputs=[S.FormalParameter("x", "tensor(int32)"), S.FormalParameter("deq_scale", "tensor(uint64)")],
            outputs=[S.FormalParameter("y", "T")],
            type_constraints=[("T", ["tensor(float)", "tensor(float16)"], "float output")],
            attributes=[S.Attribute("sqrt_mode", S.AttrType.INT, ""), S.Attribute("relu_flag", S.AttrType.INT, ""),
                        S.Attribute("dtype", S.AttrType.INT, "")]))


def deploy_model(deploy: Graph, input_name: str) -> onnx.ModelProto:
    """deploy.onnx for the deploy IR ``deploy`` (``quantization.deploy.quantized_graph``)."""
    register_ascend_schemas()
    return lower(deploy, "device", input_name=input_name, constant_outputs=True)


def check_deploy(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx.checker and shape inference over the deploy graph; returns the model with inferred shapes."""
    register_ascend_schemas()
    onnx.checker.check_model(model)
    return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)


# ----------------------------------------------------------------------------- AMCT record file

def record_text(qparams: QuantParams) -> str:
    """AMCT's quantization record for ONNX and MindSpore models (protobuf text of ``ScaleOffsetRecord``: one
    ``record`` per INT8 layer with ``scale_d``, ``offset_d``, ``scale_w`` and ``offset_w`` per output channel,
    keyed by the layer's name in the float model: its node name in graph.onnx, which is its MindSpore scope for a
    MindSpore network).  The proto is AMCT's scale_offset_record_onnx.proto / _mindspore.proto (CANN 8.0 AMCT
    documentation, atlasamct_16_0165): ``shift_bit`` is written only by AMCT's joint quantization and
    ``skip_fusion`` keeps its default; channels/height/width exist only in the Caffe record."""
    out = []
    for q in qparams.ops:
        lines = ['record {', f'  key: "{q.scope}"', '  value {', f'    scale_d: {q.scale_d:.9g}',
                 f'    offset_d: {q.offset_d}']
        lines += [f"    scale_w: {s:.9g}" for s in q.scale_w]
        lines += ["    offset_w: 0" for _ in q.scale_w]
        lines += ["  }", "}"]
        out.append("\n".join(lines))
    return "\n".join(out) + "\n"
