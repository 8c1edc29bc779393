"""Per-layer error analysis: how much each quantized op costs, measured on calibration images.

For every quantized op, against the FP32 graph on the same images:

- ``alone``: its output with that op alone in INT8 (every other op in the float16 emulation);
- ``output``: the network's output with that op alone in INT8 (the ranking key, as in AMCT's
  accuracy-based auto calibration, which ranks layers by the similarity of their quantized result);
  for a network with several outputs (a detector's heads), all of them pooled, and each output on its
  own in ``per_output``; given ``parts`` (the gate's ``evaluation.parts``, e.g. a head's class scores), each
  part on its own in ``per_part`` (``rank`` can rank on the outputs and parts that fail a gate);
- ``cumulative``: its output with every op in INT8 (the error accumulated along the graph).

Each as SQNR (dB, 10 log10 of signal over error energy) and cosine similarity.  An op whose
Dequant carries the ReLU is compared after the ReLU (that is what its deploy output is).

With ``bias_shift`` the ``alone`` runs also measure each op's per-output-channel mean error
(FP32 - INT8, on the elements both leave positive when the op ends in a ReLU): the empirical
bias correction of Nagel et al. 2019 ("Data-Free Quantization", sec. 4.2), one op at a time.

The FP32 reference of every quantized op's output is computed once and held for the analysed images
(``quantization.sensitivity_images``, 32 by default: about 320 MB for ResNet-18 at 224x224).  So is the
float16 emulation of the network with no op in INT8, keeping (as float16) the values each op's INT8
run starts from: each op's run then emulates only the deploy graph from its Quant on (``Graph.suffix``,
fed with those values; bit for bit what emulating the whole graph gives, tests/test_sensitivity.py),
about half the work of emulating every op's whole graph.  The one-op runs shard over ``[engine]``
(the references go to each worker once).  The error statistics are running sums.
"""
from __future__ import annotations

import copy
import gc
from dataclasses import dataclass, field

import numpy as np

from ..engine.runner import float_runner
from ..engine.int8_emulator import Emulator
from ..ir import Graph
from ..progress import progress
from .deploy import quantized_graph
from .qparams import QuantParams, fit, short_names

GC_EVERY = 8


class Agreement:
    """Running SQNR and cosine similarity of ``q`` against the reference ``r``."""

    def __init__(self):
        self.rr = self.qq = self.rq = self.ee = 0.0

    def add(self, r: np.ndarray, q: np.ndarray) -> None:
        # numpy's own (pairwise) sums, not BLAS dot products: those split the sum by the BLAS thread count,
        # and a sharded sweep must give the single process's numbers bit for bit.  The emulation's float16 and
        # float32 values are compared in float32 (summed in float64): no float64 copy of every tensor
        r, q = np.asarray(r).ravel(), np.asarray(q).ravel()
        dt = np.result_type(r, q, np.float32)
        r, q = r.astype(dt, copy=False), q.astype(dt, copy=False)
        e = r - q
        self.rr += float(np.sum(np.square(r), dtype=np.float64))
        self.qq += float(np.sum(np.square(q), dtype=np.float64))
        self.rq += float(np.sum(r * q, dtype=np.float64))
        self.ee += float(np.sum(np.square(e), dtype=np.float64))

    @property
    def sqnr_db(self) -> float:
        if self.ee == 0.0:
            return float("inf")
        return float(10.0 * np.log10(max(self.rr, 1e-30) / self.ee))

    @property
    def cosine(self) -> float:
        den = np.sqrt(self.rr * self.qq)
        return float(self.rq / den) if den > 0 else (1.0 if self.ee == 0.0 else 0.0)

    def as_dict(self) -> dict:
        return {"sqnr_db": self.sqnr_db, "cosine": self.cosine}


class _ChannelShift:
    """Per-channel running mean of (FP32 - INT8) along ``axis`` (1 for N,C,...; -1 for N,C)."""

    def __init__(self, relu: bool):
        self.relu = relu
        self.sum: np.ndarray | None = None
        self.count: np.ndarray | None = None

    def add(self, r: np.ndarray, q: np.ndarray) -> None:
        r, q = np.moveaxis(np.asarray(r, np.float64), 1, 0), np.moveaxis(np.asarray(q, np.float64), 1, 0)
        r, q = r.reshape(len(r), -1), q.reshape(len(q), -1)
        mask = (r > 0) & (q > 0) if self.relu else np.ones_like(r, bool)
        s, c = np.where(mask, r - q, 0.0).sum(axis=1), mask.sum(axis=1)
        self.sum = s if self.sum is None else self.sum + s
        self.count = c if self.count is None else self.count + c

    def mean(self) -> np.ndarray:
        return np.where(self.count > 0, self.sum / np.maximum(self.count, 1), 0.0)


def figure(row: dict, outputs: list[str] | None = None, parts: list[str] | None = None) -> float:
    """The SQNR (dB) ``rank`` orders op row ``row`` by: the network's output with the op alone in INT8, all
    outputs pooled; given ``outputs`` and/or ``parts``, the least SQNR among those outputs and parts, the region
    that loses most (where the row holds their figures; else pooled).  A row without ``per_output`` is of a
    network with one output: that output's figure is the pooled one."""
    def of(key: str, name: str):
        if key == "per_output" and key not in row:
            return row["output"]
        return row.get(key, {}).get(name)

    figures = [of("per_output", o) for o in outputs or ()] + [of("per_part", p) for p in parts or ()]
    if figures and all(figures):
        return min(f["sqnr_db"] for f in figures)
    return row["output"]["sqnr_db"]


def rank(rows: list[dict], outputs: list[str] | None = None, parts: list[str] | None = None) -> list[str]:
    """The ops of ``rows`` (``Sensitivity.rows``, or a sensitivity.json's "ops"), most harmful first, by ``figure``
    (given ``outputs`` and/or ``parts``: by what those measure).  Ties go by node name."""
    return [r["node"] for r in sorted(rows, key=lambda r: (figure(r, outputs, parts), r["node"]))]


def focus_label(analysis: dict) -> str:
    """What an analysis's ranking measures (its ``focus``, set where a failing gate ranked it by what fails):
    "network output", or the parts and outputs it ranks by (several: "worst of ...", the least SQNR among them)."""
    f = analysis.get("focus") or {}
    said = [f"part {p}" for p in f.get("parts", [])] + [f"output {o}" for o in f.get("outputs", [])]
    return ("worst of " if len(said) > 1 else "") + " / ".join(said) if said else "network output"


@dataclass
class Sensitivity:
    """One row per quantized op (in graph order) and the ranking (most sensitive first)."""
    rows: list[dict]
    images: int
    bias_shift: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def ranking(self) -> list[str]:
        return rank(self.rows)

    def row(self, node: str) -> dict:
        return next(r for r in self.rows if r["node"] == node)

    def as_dict(self) -> dict:
        return {"images": self.images, "ranking": self.ranking, "ops": self.rows}

    def table(self, top: int | None = None) -> str:
        """The ``top`` most sensitive ops (all by default), each by its short name (``qparams.short_names``,
        unique among all the ops) with its full layer scope last."""
        short = short_names([r["scope"] for r in self.rows])
        ranked = self.ranking[:top] if top else self.ranking
        width = min(40, max([len(short[self.row(n)["scope"]]) for n in ranked] + [5]))
        lines = [f"  {'rank':>4} {'layer':<{width}} {'output SQNR dB':>14} {'alone SQNR dB':>13} {'cumulative':>10}"
                 f"  full layer name"]
        for i, node in enumerate(ranked, 1):
            r = self.row(node)
            lines.append(f"  {i:>4} {fit(short[r['scope']], width):<{width}} {r['output']['sqnr_db']:>14.1f} "
                         f"{r['alone']['sqnr_db']:>13.1f} {r['cumulative']['sqnr_db']:>10.1f}  {r['scope']}")
        return "\n".join(lines)


def _only(qparams: QuantParams, node: str) -> QuantParams:
    return qparams.only([node])


def _references(graph: Graph, qparams: QuantParams, inputs: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The float32 outputs of every quantized op (after its ReLU, where the INT8 op has one) and of the
    network, per batch."""
    out_of = {n.name: n.outputs[0] for n in graph.nodes}
    finals = list(graph.outputs)
    op_outputs = [out_of[q.node] for q in qparams.ops]
    fp32 = float_runner(graph, op_outputs)
    relu_outputs = {out_of[q.node] for q in qparams.ops if q.relu}
    names = list(dict.fromkeys(op_outputs + finals))
    return [{k: np.maximum(v, 0) if k in relu_outputs and k not in finals else v for k, v in fp32.run(x, names).items()}
            for x in inputs]


def _from_its_quant(graph: Graph, qparams: QuantParams, node: str) -> Graph:
    """The deploy graph of ``node`` alone in INT8, from its Quant on (what precedes it is the float
    graph's own nodes); the whole deploy graph where the cut would be fed anything but float tensors with
    one row per image (a ConvNeXt or ViT Dense reads (images x positions, channels): the runs feed the cut
    in batches of images)."""
    deploy = quantized_graph(graph, _only(qparams, node))
    tail = deploy.suffix(next(i for i, n in enumerate(deploy.nodes) if n.op == "Quant"))
    batch = graph.tensors[graph.inputs[0]].shape[:1]
    per_image = all(tail.tensors[i].dtype in ("float32", "float16") and tail.tensors[i].shape[:1] == batch
                    for i in tail.inputs)
    return tail if per_image else deploy


def _prefixes(graph: Graph, qparams: QuantParams, inputs: list[np.ndarray], nodes: list[str]) -> list[dict]:
    """Per batch, the float16 values (no op in INT8) of every tensor the runs of ``nodes`` start from."""
    starts = list(dict.fromkeys(i for node in nodes for i in _from_its_quant(graph, qparams, node).inputs))
    no_int8 = Emulator(quantized_graph(graph, qparams.only([])), extra_outputs=starts)
    # float16 holds them exactly (the emulation's values are float16 numbers): half the memory, no conversion per run
    return [{k: v.astype(np.float16) for k, v in no_int8.outputs(x.astype(np.float16), starts).items()} for x in inputs]


def _op_rows(shared, nodes: list[str]) -> list[tuple[dict, np.ndarray | None]]:
    """(row, output mean shift) of each op in ``nodes`` alone in INT8 (a shard of the sweep)."""
    graph, qparams, refs, prefixes, bias_shift, parts = shared
    out_of = {n.name: n.outputs[0] for n in graph.nodes}
    finals = list(graph.outputs)
    by_node = {q.node: q for q in qparams.ops}
    done = []
    with progress(len(nodes), "sensitivity: per-layer runs") as bar:
        for node in nodes:
            q, t, run = by_node[node], out_of[node], _from_its_quant(graph, qparams, node)
            emu = Emulator(run, extra_outputs=[t])
            alone, output, shift = Agreement(), Agreement(), _ChannelShift(q.relu)
            each = {f: Agreement() for f in finals}
            each_part = {name: Agreement() for name in parts}
            for prefix, ref in zip(prefixes, refs):
                got = emu.outputs({i: prefix[i] for i in run.inputs}, list(dict.fromkeys([t] + finals)))
                alone.add(ref[t], got[t])
                for f in finals:
                    output.add(ref[f], got[f])
                    each[f].add(ref[f], got[f])
                for name, (f, region) in parts.items():
                    n = len(ref[f])
                    each_part[name].add(region.take(ref[f], n), region.take(got[f], n))
                if bias_shift:
                    shift.add(ref[t], got[t])
            del emu
            if len(done) % GC_EVERY == GC_EVERY - 1:
                gc.collect()  # a few onnxruntime sessions at a time (a collection per op cost a fifth of the sweep)
            row = {"node": node, "scope": q.scope, "op": q.op, "method": q.stats.get("method", qparams.method),
                   "alone": alone.as_dict(), "output": output.as_dict()}
            if len(finals) > 1:
                row["per_output"] = {f: a.as_dict() for f, a in each.items()}
            if parts:
                row["per_part"] = {name: a.as_dict() for name, a in each_part.items()}
            done.append((row, shift.mean() if bias_shift else None))
            bar.update(1)
    return done


def analyse(graph: Graph, qparams: QuantParams, batches, bias_shift: bool = False, engine=None,
            parts: dict | None = None) -> Sensitivity:
    """The per-op errors of ``qparams`` on the (BatchNorm-folded) ``graph`` over ``batches`` (a re-iterable
    of float N,C,H,W arrays in the training preprocessing; the emulation reads them as float16).  ``parts``:
    name -> (the graph output it is part of, ``evaluation.parts.Region``), each measured on its own.  The
    one-op-at-a-time runs shard over ``engine`` (quantflow.engine.shard), with the same numbers."""
    from ..engine import shard

    graph = qparams.apply(graph)  # the FP32 references of the ops' outputs: from the recovered float weights
    out_of = {n.name: n.outputs[0] for n in graph.nodes}
    op_outputs = [out_of[q.node] for q in qparams.ops]
    inputs = [np.asarray(x) for x in batches]
    nodes = [q.node for q in qparams.ops]
    refs = _references(graph, qparams, inputs)
    shared = (graph, qparams, refs, _prefixes(graph, qparams, inputs, nodes), bias_shift, dict(parts or {}))
    parts = shard.run(_op_rows, shared, shard.deal(nodes, engine.workers if engine else 1), engine)
    done = {row["node"]: (row, shift) for part in parts for row, shift in part}
    del shared, parts  # the start values: not needed below
    rows = [done[node][0] for node in nodes]
    shifts = {node: done[node][1] for node in nodes} if bias_shift else {}
    with progress(1, "sensitivity: all layers in INT8") as bar:
        emu = Emulator(quantized_graph(graph, qparams), extra_outputs=op_outputs)
        cumulative = {q.node: Agreement() for q in qparams.ops}
        for x, ref in zip(inputs, refs):
            got = emu.outputs(x.astype(np.float16), op_outputs)
            for q in qparams.ops:
                cumulative[q.node].add(ref[out_of[q.node]], got[out_of[q.node]])
        for r in rows:
            r["cumulative"] = cumulative[r["node"]].as_dict()
        bar.update(1)
    return Sensitivity(rows, sum(len(x) for x in inputs), shifts)


def correct_bias(qparams: QuantParams, shifts: dict[str, np.ndarray]) -> QuantParams:
    """``qparams`` with each op's int32 bias moved by its measured mean shift (in accumulator units:
    shift / (scale_d * scale_w[c])), so that its INT8 output mean matches FP32 per channel."""
    out = copy.deepcopy(qparams)
    limits = np.iinfo(np.int32)
    for q in out.ops:
        if q.node not in shifts:
            continue
        step = q.scale_d * np.asarray(q.scale_w, np.float64)
        moved = q.bias.astype(np.float64) + np.rint(shifts[q.node] / step)  # clipped before any integer cast
        q.bias = np.clip(moved, limits.min, limits.max).astype(np.int32)
        q.stats["bias_corrected"] = True
    return out
