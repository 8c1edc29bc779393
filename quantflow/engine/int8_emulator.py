"""INT8 emulation of what the Ascend device computes for the quantized graph.

The emulation is an onnxruntime graph of the deploy IR (``quantization.deploy.quantized_graph``),
lowered op for op as the deploy graph is (opset 13), with

- Quant, the int8 cube and Dequant lowered to the device's arithmetic (``quantflow.ops.quant``:
  float16 AscendQuant, exact int32 accumulation, float32 deq_scale to float16);
- every other ONNX operation on float16 values: float16-rounded constants, computed in float32,
  its output rounded to float16 (round to nearest even).

onnxruntime's graph optimizations run (they turn the float convolutions into its NCHWc layout:
exact on the integers of a grouped int8 cube, and the float16 rounding after each such op is kept),
vetted per model: when the optimized graph lost any of the rounding or integer steps
(``ARITHMETIC_STEPS``), the emulation runs unoptimized instead.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx

from ..ir import Graph, Node
from ..ops import get as get_op
from ..ops.quant import round16
from ..quantization.deploy import quantized_graph
from ..quantization.qparams import QuantParams
from .float_runner import Runner
from .onnx_builder import DEVICE_OPSET, OnnxBuilder


# ONNX operations whose outputs are some of their inputs' values: on float16 values they give float16 values
VALUE_PRESERVING = {"Relu", "MaxPool", "Max", "Min", "Clip", "Reshape", "Transpose", "Flatten", "Squeeze",
                    "Unsqueeze", "Concat", "Slice", "Split", "Identity", "Gather", "Expand", "Tile", "ScatterND",
                    "Neg", "Abs"}


def _needs_rounding(b: OnnxBuilder, n: onnx.NodeProto) -> bool:
    """False where the output is float16-valued already: a value-preserving operation whose float
    constant inputs (e.g. Clip's bounds) are float16 numbers (every other tensor here is float16-valued)."""
    if n.op_type not in VALUE_PRESERVING:
        return True
    consts = [b.initializers[i] for i in n.input if i in b.initializers]
    return any(c.dtype == np.float32 and not np.array_equal(c, c.astype(np.float16).astype(np.float32))
               for c in consts)


def _float16_node(b: OnnxBuilder, node: Node) -> None:
    """The node's device lowering, every ONNX operation in it on float16 values (rounded after each), its own
    float constants (GeLU's 0.044715, ...) float16 numbers as the graph's are."""
    first, known = len(b.nodes), set(b.initializers)
    get_op(node.op, node.name).to_onnx(node, b)
    for k in set(b.initializers) - known:
        if b.initializers[k].dtype == np.float32:
            b.initializers[k] = b.initializers[k].astype(np.float16).astype(np.float32)
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


def emulation_model(graph: Graph, extra_outputs=()) -> onnx.ModelProto:
    """The emulation of a deploy IR (one holding Quant / int8 cube / Dequant nodes); ``extra_outputs``:
    inner float tensors to expose as well (e.g. a quantized op's output)."""
    b = OnnxBuilder(f"{graph.name}_int8_emulation", opset=DEVICE_OPSET, taken=graph.names())
    for k, v in graph.initializers.items():
        b.initializer(k, v.astype(np.float16).astype(np.float32) if v.dtype == np.float32 else v)
    feeds = [b.fresh("float16_input") for _ in graph.inputs]
    for feed, inp in zip(feeds, graph.inputs):  # float16 values (the AIPP output), computed on as float32
        b.add("Cast", [feed], inp, to=onnx.TensorProto.FLOAT)
    for node in graph.nodes:
        floating = all(graph.tensors[o].dtype in ("float32", "float16") for o in node.outputs)
        if floating and not get_op(node.op, node.name).rounds_itself:
            _float16_node(b, node)
        else:
            get_op(node.op, node.name).to_onnx(node, b)
    outs = list(graph.outputs) + [t for t in extra_outputs if t not in graph.outputs]
    return b.model([(f, graph.tensors[i].shape, "float16") for f, i in zip(feeds, graph.inputs)],
                   [(o, graph.shape(o), "float32") for o in outs])


# the ONNX operations that carry the device's roundings and integer arithmetic in the emulation
ARITHMETIC_STEPS = ("Cast", "QuantizeLinear", "DequantizeLinear", "ConvInteger", "MatMulInteger")


def _step_counts(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node if n.op_type in ARITHMETIC_STEPS and n.domain in ("", "ai.onnx"))


class Emulator(Runner):
    """Runs the emulation on float16-valued inputs (the AIPP output).

    ``graph``: a deploy IR, or a BatchNorm-folded float IR together with its ``qparams``.  A graph with
    several inputs (e.g. ``Graph.suffix``) takes a dict input name -> float16-valued array."""

    def __init__(self, graph: Graph, qparams: QuantParams | None = None, extra_outputs=()):
        deploy = quantized_graph(graph, qparams) if qparams is not None else graph
        model = emulation_model(deploy, extra_outputs)
        steps = _step_counts(model)
        self.feeds = dict(zip(deploy.inputs, (i.name for i in model.graph.input)))
        super().__init__(model, self.feeds[deploy.inputs[0]], deploy.tensors[deploy.inputs[0]].shape[0],
                         keeps=lambda optimized: _step_counts(optimized) == steps, input_dtype=np.float16)
        self.graph = deploy

    def logits(self, x16) -> np.ndarray:
        return self.outputs(x16)[self.graph.outputs[0]]

    def outputs(self, x16, names: list[str] | None = None) -> dict[str, np.ndarray]:
        if isinstance(x16, dict):
            return self.run({self.feeds[k]: np.asarray(v, np.float16) for k, v in x16.items()}, names)
        return self.run(np.asarray(x16, np.float16), names)
