"""The recovery's yardstick: each INT8 op's output, with every op upstream in INT8 too (the device's arithmetic:
the emulation of the deploy graph), against FP32 on the same images; and the network's outputs.

The FP32 references are computed from the parameters' own float graph (``QuantParams.apply``): equalization
rescales the channels between two layers, and a layer's output is compared with the FP32 output of the same
(rescaled) layer.  An op whose Dequant carries the ReLU is compared after the ReLU, as in the per-layer analysis.

The pooled SQNR of an output is its noise energy summed over the images, and where a few images sit near a decision
(a classifier's softmax between two classes) those few carry most of it: on PP-LCNet's 32 recovery images one
image carried 47% of the noise, and feeding the same images through AIPP instead of as float16 changed that
image's noise 6-fold and turned learned rounding's effect on the pooled figure from -1.1 dB to +1.9 dB.  The mean
of the per-image SQNRs (``TYPICAL``) weighs every image alike; over the same images its change is the mean of the
per-image noise ratios in dB, a paired figure with a standard error (``nearer_per_image``), and it told learned
rounding's gain (+3.6 dB on the recovery images, standard error 1.5; +3.5 on 160 held-out ones) where the pooled
figure did not.
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
TYPICAL = "per-image mean (least region)"   # the least over the regions of the mean per-image SQNR (dB)
PER_IMAGE = "per-image SQNR dB"   # region label (NETWORK without regions) -> each image's SQNR, in input order
CAP_DB = 100.0               # an image's SQNR is taken as at most this (an exact output has no noise to divide by)
NEARER_Z = 1.645             # standard errors a paired per-image gain must exceed (one-sided 95%)


def is_output_row(key: str) -> bool:
    """Whether a measurement's key is a figure of the network's outputs (pooled, a region's, the per-image
    figure) rather than an INT8 op's."""
    return key in (NETWORK, TYPICAL) or key.startswith(REGION)


def nearer_per_image(before: dict, after: dict, z: float = NEARER_Z) -> dict | None:
    """Whether ``after`` (a measurement of ``layer_sqnr`` on the same images) is nearer FP32 than ``before``
    beyond the images' noise, on the region ``before`` serves worst (the least mean per-image SQNR): the mean of
    the paired per-image changes in dB above ``z`` standard errors.  ``{"region", "change", "se", "nearer"}``;
    None where either lacks the per-image figures (nothing measured) or there are fewer than two images."""
    a, b = (before or {}).get(PER_IMAGE), (after or {}).get(PER_IMAGE)
    if not a or not b:
        return None
    region = min(a, key=lambda k: float(np.mean(a[k])))
    d = np.asarray(b[region], np.float64) - np.asarray(a[region], np.float64)
    if len(d) < 2:
        return None
    se = float(np.std(d, ddof=1) / np.sqrt(len(d)))
    change = float(np.mean(d))
    return {"region": region, "change": change, "se": se, "nearer": bool(change > z * se)}


def per_image_db(signal: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """Each image's SQNR in dB from its signal and noise energies, at most ``CAP_DB``."""
    s = np.maximum(np.asarray(signal, np.float64), 1e-30)
    return 10.0 * np.log10(s / np.maximum(np.asarray(noise, np.float64), s * 10.0 ** (-CAP_DB / 10.0)))


def _energies(ref: np.ndarray, got: np.ndarray, n: int) -> np.ndarray:
    """(signal, noise) energy per image (n x 2) of ``got`` against ``ref``, rows the images."""
    f = np.asarray(ref).reshape(n, -1).astype(np.float64)
    d = np.asarray(got).reshape(n, -1).astype(np.float64)
    return np.stack([np.sum(f * f, 1), np.sum((f - d) ** 2, 1)], 1)


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
               refs: list[dict] | None = None, regions: list | None = None) -> dict:
    """node -> SQNR (dB) of each INT8 op's output with all ops in INT8; ``NETWORK`` -> the network's outputs
    pooled; per region of ``regions`` (each output once, whole or by its parts: ``evaluation.parts.finest``, in
    IR names) ``REGION + label`` -> its SQNR; ``GUARD`` -> the least of those (the pooled figure without
    regions); ``TYPICAL`` -> the least over the regions (the outputs whole without) of the mean per-image SQNR
    (``per_image_db``), and ``PER_IMAGE`` -> those per-image SQNRs by region, on ``inputs`` (float N,C,H,W
    batches; the emulation reads them as float16).  Pooled, a detector's boxes in pixels would hide its scores in
    0..1; the least region does not."""
    refs = refs if refs is not None else references(graph, qparams, inputs)
    g = qparams.apply(graph)
    out_of = {n.name: n.outputs[0] for n in g.nodes}
    outs = [out_of[q.node] for q in qparams.ops]
    emu = Emulator(quantized_graph(g, qparams), extra_outputs=outs)
    each = {q.node: Agreement() for q in qparams.ops}
    network = Agreement()
    parts = {r.label: Agreement() for r in regions or []}
    images: list[list[np.ndarray]] = [[] for _ in (regions or [None])]   # per region: (signal, noise) per image
    for x, ref in zip(inputs, refs):
        got = emu.outputs(np.asarray(x, np.float16), list(dict.fromkeys(outs + list(g.outputs))))
        for q in qparams.ops:
            each[q.node].add(ref[out_of[q.node]], got[out_of[q.node]])
        for o in g.outputs:
            network.add(ref[o], got[o])
        for r in regions or []:
            parts[r.label].add(ref[r.output][r.index], got[r.output][r.index])
        n = len(x)
        if regions:
            for k, r in enumerate(regions):
                images[k].append(_energies(r.take(ref[r.output], n), r.take(got[r.output], n), n))
        else:
            images[0].append(sum(_energies(ref[o], got[o], n) for o in g.outputs))
    figures = {**{n: a.sqnr_db for n, a in each.items()}, NETWORK: network.sqnr_db,
               **{REGION + k: a.sqnr_db for k, a in parts.items()}}
    figures[GUARD] = min((a.sqnr_db for a in parts.values()), default=network.sqnr_db)
    labels = [r.label for r in regions] if regions else [NETWORK]
    each_image = {k: per_image_db(e[:, 0], e[:, 1]) for k, e in zip(labels, map(np.concatenate, images))}
    figures[TYPICAL] = min(float(np.mean(v)) for v in each_image.values())
    figures[PER_IMAGE] = {k: [float(x) for x in v] for k, v in each_image.items()}
    return figures
