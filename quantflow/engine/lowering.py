"""The one seam from the graph IR to ONNX: every IR node lowered through its registry entry, for one of three
targets.

- ``"float32"``: what the network computes, in float32 (opset 17), for onnxruntime: the FP32 reference,
  calibration, ``graph.onnx``.
- ``"float16"``: what the Ascend device computes (opset 13, op for op as the deploy graph): Quant, the int8
  cube and Dequant lowered to the device's arithmetic (``quantflow.ops.quant``), every other ONNX operation on
  float16 values (float16-rounded constants, the op's own included; computed in float32, each output rounded
  to float16).  The graph inputs are float16 (the AIPP output).  This is the INT8 emulation's model.
- ``"device"``: the deploy graph atc compiles (opset 13): AscendQuant / the int8 Conv or Gemm / AscendDequant
  as the deploy operators, everything else ordinary float ONNX.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..ir import Graph, Node
from ..ops import get as get_op
from ..ops.quant import round16
from .onnx_builder import DEVICE_OPSET, OPSET, OnnxBuilder

TARGETS = ("float32", "float16", "device")

# ONNX operations whose outputs are some of their inputs' values: on float16 values they give float16 values
VALUE_PRESERVING = {"Relu", "MaxPool", "Max", "Min", "Clip", "Reshape", "Transpose", "Flatten", "Squeeze",
                    "Unsqueeze", "Concat", "Slice", "Split", "Identity", "Gather", "Expand", "Tile", "ScatterND",
                    "Neg", "Abs"}


def lower(graph: Graph, target: str = "float32", input_name: str | None = None,
          extra_outputs=(), constant_outputs: bool = False) -> onnx.ModelProto:
    """``graph`` as an ONNX model for ``target`` (module doc).  ``input_name`` renames the (first: the image) graph
    input (MindIR input names are not valid atc --input_shape names); the others keep their names; ``extra_outputs``: inner tensors to expose as
    well (observers, a quantized op's output); ``constant_outputs``: the source model's constant outputs
    (``Graph.constant_outputs``) after the others, as the graphs written for deployment keep them."""
    if target not in TARGETS:
        raise ValueError(f"unknown lowering target {target!r} (one of {', '.join(TARGETS)})")
    float16 = target == "float16"
    b = OnnxBuilder(f"{graph.name}{_SUFFIX[target]}", opset=OPSET if target == "float32" else DEVICE_OPSET,
                    target="device" if target == "device" else "compute", taken=graph.names() | {input_name})
    for k, v in graph.initializers.items():
        b.initializer(k, _to_float16(v) if float16 else v)
    if float16:  # float16 values (the AIPP output), computed on as float32
        feeds = [b.fresh("float16_input") for _ in graph.inputs]
        for feed, inp in zip(feeds, graph.inputs):
            b.add("Cast", [feed], inp, to=onnx.TensorProto.FLOAT)
        inputs = [(f, graph.tensors[i].shape, "float16") for f, i in zip(feeds, graph.inputs)]
    else:
        inp = graph.inputs[0]
        if input_name and input_name != inp:
            b.add("Identity", [input_name], inp)
        inputs = [(input_name or inp if i == inp else i, graph.tensors[i].shape,
                   graph.tensors[i].dtype if target == "float32" else "float32") for i in graph.inputs]
    named: set[str] = set()
    for node in graph.nodes:
        floating = all(graph.tensors[o].dtype in ("float32", "float16") for o in node.outputs)
        if float16 and floating and not get_op(node.op, node.name).rounds_itself:
            _float16_node(b, node)
            continue
        first = len(b.nodes)
        get_op(node.op, node.name).to_onnx(node, b)
        _name_after(node, b.nodes[first:], named)
    outs = list(graph.outputs) + [t for t in extra_outputs if t not in graph.outputs]
    described = [(o, graph.shape(o), "float32" if target != "float32" else _dtype(graph, o)) for o in outs]
    for name, value in (graph.constant_outputs.items() if constant_outputs else ()):
        b.add("Identity", [b.initializer(b.fresh(f"{name}_value"), value)], name)
        described.append((name, value.shape, value.dtype.name))
    return b.model(inputs, described)


_SUFFIX = {"float32": "", "float16": "_int8_emulation", "device": "_ascend_int8"}


def _dtype(graph: Graph, name: str) -> str:
    return graph.tensors[name].dtype if name in graph.tensors else "float32"


def _name_after(node: Node, lowered: list, named: set[str]) -> None:
    """The ONNX node that computes an IR node's (first) output is named by the IR node's layer (its MindSpore scope
    or ONNX node name), once: graph.onnx and deploy.onnx name their layers as the source model does (AMCT's
    record is keyed by these names)."""
    for n in reversed(lowered):
        if node.outputs[0] in n.output and node.label not in named:
            n.name = node.label
            named.add(node.label)
            return


def _to_float16(v: np.ndarray) -> np.ndarray:
    """A float32 array's float16 values (held as float32); other arrays as they are."""
    return v.astype(np.float16).astype(np.float32) if v.dtype == np.float32 else v


def _needs_rounding(b: OnnxBuilder, n: onnx.NodeProto) -> bool:
    """False where the output is float16-valued already: a value-preserving operation whose float
    constant inputs (e.g. Clip's bounds) are float16 numbers (every other tensor here is float16-valued)."""
    if n.op_type not in VALUE_PRESERVING:
        return True
    consts = [b.initializers[i] for i in n.input if i in b.initializers]
    return any(c.dtype == np.float32 and not np.array_equal(c, c.astype(np.float16).astype(np.float32))
               for c in consts)


def _float16_node(b: OnnxBuilder, node: Node) -> None:
    """The node's lowering, every ONNX operation in it on float16 values (rounded after each), its own float
    constants (GeLU's 0.044715, ...) float16 numbers as the graph's are."""
    first, known = len(b.nodes), set(b.initializers)
    get_op(node.op, node.name).to_onnx(node, b)
    for k in set(b.initializers) - known:
        b.initializers[k] = _to_float16(b.initializers[k])
    lowered = b.nodes[first:]
    del b.nodes[first:]
    for n in lowered:
        if not _needs_rounding(b, n):
            b.nodes.append(n)
            continue
        outs = list(n.output)
        n.output[:] = [b.fresh("f32") for _ in outs]
        b.nodes.append(n)
        for tmp, out in zip(n.output, outs):
            round16(b, tmp, out)
