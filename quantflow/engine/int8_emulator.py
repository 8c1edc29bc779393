"""INT8 emulation of what the Ascend device computes for a deploy graph.

``Emulator`` runs the ``"float16"`` lowering of a deploy IR (``quantflow.engine.lowering``; the deploy IR is
built by its caller with ``quantization.deploy.quantized_graph``) with onnxruntime, from float16 inputs (the
AIPP output).  onnxruntime's graph optimizations run (they turn the float convolutions into its NCHWc
layout: exact on the integers of a grouped int8 cube, and the float16 rounding after each such op is kept),
vetted per model: when the optimized graph lost any of the rounding or integer steps (``ARITHMETIC_STEPS``),
the emulation runs unoptimized instead.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx

from ..ir import Graph
from .lowering import lower
from .runner import Runner

# the ONNX operations that carry the device's roundings and integer arithmetic in the emulation
ARITHMETIC_STEPS = ("Cast", "QuantizeLinear", "DequantizeLinear", "ConvInteger", "MatMulInteger")


def _step_counts(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node if n.op_type in ARITHMETIC_STEPS and n.domain in ("", "ai.onnx"))


def keeps_every_step(model: onnx.ModelProto):
    """The vetting of onnxruntime's optimizations of an emulation ``model`` (``Runner``'s ``keeps``): the
    optimized graph must keep every rounding and integer step."""
    steps = _step_counts(model)
    return lambda optimized: _step_counts(optimized) == steps


class Emulator(Runner):
    """Runs the emulation of the deploy IR ``graph`` on float16-valued inputs (the AIPP output).  A graph with
    several inputs (e.g. ``Graph.suffix``) takes a dict input name -> float16-valued array; the inputs in
    ``Graph.fixed_inputs`` (a detector's scale_factor) are fed their values, as float16 the device computes them in.  ``extra_outputs``:
    inner float tensors to expose as well (e.g. a quantized op's output)."""

    def __init__(self, graph: Graph, extra_outputs=()):
        model = lower(graph, "float16", extra_outputs=extra_outputs)
        self.feeds = dict(zip(graph.inputs, (i.name for i in model.graph.input)))
        super().__init__(model, self.feeds[graph.inputs[0]], graph.tensors[graph.inputs[0]].shape[0],
                         keeps=keeps_every_step(model), input_dtype=np.float16,
                         fixed={self.feeds[k]: v for k, v in graph.fixed_inputs.items() if k in self.feeds})
        self.graph = graph

    def logits(self, x16) -> np.ndarray:
        return self.outputs(x16)[self.graph.outputs[0]]

    def outputs(self, x16, names: list[str] | None = None) -> dict[str, np.ndarray]:
        if isinstance(x16, dict):
            return self.run({self.feeds[k]: np.asarray(v, np.float16) for k, v in x16.items()}, names)
        return self.run(np.asarray(x16, np.float16), names)
