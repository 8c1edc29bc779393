"""The recovery's yardstick: each INT8 op's output, with every op upstream in INT8 too (the device's arithmetic:
the emulation of the deploy graph), against FP32 on the same images; and the network's outputs.

The FP32 references are computed from the parameters' own float graph (``QuantParams.apply``): equalization
rescales the channels between two layers, and a layer's output is compared with the FP32 output of the same
(rescaled) layer.  An op whose Dequant carries the ReLU is compared after the ReLU, as in the per-layer analysis.
"""
from __future__ import annotations

import numpy as np

from ...engine.int8_emulator import Emulator
from ...engine.runner import float_runner
from ...ir import Graph
from ..deploy import quantized_graph
from ..qparams import QuantParams
from ..sensitivity import Agreement

NETWORK = "network output"   # the key of the network's outputs (pooled) in a measurement
REGION = "output region: "   # the prefix of a compared region's key (an output, or a part of one: its label)
GUARD = "least region"       # the key of the guard's figure: the least SQNR of the compared regions


def references(graph: Graph, qparams: QuantParams, inputs: list[np.ndarray], nodes=None) -> list[dict]:
    """Per batch, the FP32 outputs (float32) of the INT8 ops of ``nodes`` (default: all) and of the network."""
    g = qparams.apply(graph)
    out_of = {n.name: n.outputs[0] for n in g.nodes}
    ops = [q for q in qparams.ops if nodes is None or q.node in nodes]
    names = list(dict.fromkeys([out_of[q.node] for q in ops] + list(g.outputs)))
    relu = {out_of[q.node] for q in ops if q.relu} - set(g.outputs)
    run = float_runner(g, names)
    return [{k: np.maximum(v, 0) if k in relu else v for k, v in run.run(x, names).items()} for x in inputs]


def layer_sqnr(graph: Graph, qparams: QuantParams, inputs: list[np.ndarray],
               refs: list[dict] | None = None, regions: list | None = None) -> dict[str, float]:
    """node -> SQNR (dB) of each INT8 op's output with all ops in INT8; ``NETWORK`` -> the network's outputs
    pooled; per region of ``regions`` (each output once, whole or by its parts: ``evaluation.parts.finest``, in
    IR names) ``REGION + label`` -> its SQNR; and ``GUARD`` -> the least of those (the pooled figure without
    regions), on ``inputs`` (float N,C,H,W batches; the emulation reads them as float16).  Pooled, a detector's
    boxes in pixels would hide its scores in 0..1; the least region does not."""
    refs = refs if refs is not None else references(graph, qparams, inputs)
    g = qparams.apply(graph)
    out_of = {n.name: n.outputs[0] for n in g.nodes}
    outs = [out_of[q.node] for q in qparams.ops]
    emu = Emulator(quantized_graph(g, qparams), extra_outputs=outs)
    each = {q.node: Agreement() for q in qparams.ops}
    network = Agreement()
    parts = {r.label: Agreement() for r in regions or []}
    for x, ref in zip(inputs, refs):
        got = emu.outputs(np.asarray(x, np.float16), list(dict.fromkeys(outs + list(g.outputs))))
        for q in qparams.ops:
            each[q.node].add(ref[out_of[q.node]], got[out_of[q.node]])
        for o in g.outputs:
            network.add(ref[o], got[o])
        for r in regions or []:
            parts[r.label].add(ref[r.output][r.index], got[r.output][r.index])
    figures = {**{n: a.sqnr_db for n, a in each.items()}, NETWORK: network.sqnr_db,
               **{REGION + k: a.sqnr_db for k, a in parts.items()}}
    figures[GUARD] = min((a.sqnr_db for a in parts.values()), default=network.sqnr_db)
    return figures
