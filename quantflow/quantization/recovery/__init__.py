"""Recovery: INT8 brought closer to FP32 before any layer is given up to float16, label-free, on calibration
images, in the device's arithmetic.  One module per method, behind ``METHODS`` (as the range methods are):

- ``equalize`` (``equalize.py``): cross-layer equalization, exact on the float network; the INT8 parameters are
  then calibrated again on the rescaled network (its activations between the pairs changed);
- ``ranges`` (``output_ranges.py``): each INT8 op's input clip chosen by the error at that op's output, with every
  op upstream in INT8, among candidate clips;
- ``adaround`` (``adaround.py``): each INT8 op's weight rounding (up or down on the device's per-channel grid)
  learned to reproduce its FP32 output from its INT8 upstream inputs; then its bias corrected.

``recover`` runs the methods asked for in order and measures, before and after each, every INT8 op's output
(with all ops in INT8) and the network's outputs against FP32 (``measure``); with ``guard`` a method that lowers
the least SQNR of the regions the gate compares (each output, or its parts: ``measure.GUARD``) is undone.  Only ``QuantParams`` change: int8 weights, scales, biases, and the folded
graph's float weights (``QuantParams.float_weights``) that every deploy graph is built from.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from ...ir import Graph
from ...progress import progress
from ..qparams import QuantParams
from .measure import GUARD, NETWORK, REGION, TYPICAL, layer_sqnr, references


@dataclass
class Context:
    graph: Graph                                   # the BatchNorm-folded network, as the graph stage read it
    inputs: list[np.ndarray]                       # calibration batches (float, the training preprocessing)
    recalibrate: Callable[[QuantParams], QuantParams]   # the calibration again, on qparams' float weights
    iterations: int = 3                            # adaround: coordinate-descent passes per layer, at most
    positions: int = 2048                          # adaround / ranges: output positions sampled per layer
    auto: bool = False                             # equalize only the tensors INT8 starves ("auto", no tuning images)
    regions: list | None = None                    # the outputs / parts the guard judges (measure.layer_sqnr)
    references: dict = field(default_factory=dict)  # _float_key -> measure.references: FP32 once per float graph
    layer_data: tuple | None = None                # (parameters, layerdata.gather of them): layerdata.gathered


@dataclass(frozen=True)
class RecoveryMethod:
    name: str
    cheap: bool                                    # "auto" runs it in every build (guarded)
    run: Callable[[Context, QuantParams], tuple[QuantParams, dict]]   # -> (new parameters, what it did)
    doc: str


def _equalize(ctx: Context, qp: QuantParams) -> tuple[QuantParams, dict]:
    from .equalize import equalize

    weights, pairs, alone = equalize(qp.apply(ctx.graph), {q.node for q in qp.ops}, ctx.inputs, ctx.auto)
    if not weights:
        return qp, {"pairs": [], "left_alone": alone}
    merged = {**qp.float_weights}
    for node, w in weights.items():
        merged[node] = {**merged.get(node, {}), **w}
    out = ctx.recalibrate(replace(qp, float_weights=merged))
    # the calibration again ran on the scaled graph (qp.apply): the input channel scales stay as they were
    return replace(out, float_weights=merged, channel_scales=qp.channel_scales), {"pairs": pairs, "left_alone": alone}


def _ranges(ctx: Context, qp: QuantParams) -> tuple[QuantParams, dict]:
    from .output_ranges import output_ranges
    return output_ranges(ctx, qp)


def _adaround(ctx: Context, qp: QuantParams) -> tuple[QuantParams, dict]:
    from .adaround import adaround
    return adaround(ctx, qp)


METHODS: dict[str, RecoveryMethod] = {m.name: m for m in (
    RecoveryMethod("equalize", True, _equalize, "cross-layer equalization (exact on FP32), then calibration again"),
    RecoveryMethod("ranges", False, _ranges, "each op's input clip chosen by the error at its output"),
    RecoveryMethod("adaround", False, _adaround, "learned weight rounding per layer, then bias correction"),
)}
CHEAP = tuple(m.name for m in METHODS.values() if m.cheap)
COSTLY = tuple(m.name for m in METHODS.values() if not m.cheap)


def new_record(qp: QuantParams) -> dict:
    """An empty recovery record for ``qp``: its INT8 layers by node, no step yet."""
    return {"layers": {q.node: {"scope": q.scope} for q in qp.ops}, "steps": []}


def recover(ctx: Context, qp: QuantParams, methods, guard: bool = False,
            record: dict | None = None) -> tuple[QuantParams, dict]:
    """(the recovered parameters, the record): ``methods`` (names in ``METHODS``) run in order on ``qp``.  The
    record holds per method what it did and every INT8 op's output SQNR (dB, all ops in INT8) before and after,
    and the network's (none where no method changed anything: then no emulation runs); ``guard``: a method that
    lowers the least SQNR of ``ctx.regions`` (``measure.GUARD``) is undone (``kept`` false).
    ``record``: an earlier record to continue (its last measurement is this ``qp``'s)."""
    record = record or new_record(qp)
    for name in methods:
        with progress(1, f"recovery: {name}") as bar:
            new, notes = METHODS[name].run(ctx, qp)
            if new is qp:   # nothing to do (e.g. no pair to equalize): no emulation runs, a model costs as before
                record["steps"].append({"method": name, "kept": True, "notes": notes, "after": {}, "changed": False})
                bar.update(1)
                continue
            if not record.get("before"):
                record["before"] = _measure(ctx, qp)
            after = _measure(ctx, new)
            bar.update(1)
        current = _last(record)
        kept = not guard or after[GUARD] >= current[GUARD]
        record["steps"].append({"method": name, "kept": kept, "notes": notes, "after": after})
        for q in qp.ops:
            record["layers"].setdefault(q.node, {"scope": q.scope})
        if kept:
            qp = new
    return qp, record


def _last(record: dict) -> dict:
    kept = [s["after"] for s in record["steps"] if s["kept"] and s["after"]]
    return kept[-1] if kept else record["before"]


def last_measurement(record: dict) -> dict | None:
    """The measurement (``measure.layer_sqnr``) of the parameters the record's kept steps end at; None where
    nothing was measured (no method changed anything)."""
    return _last(record) if record.get("before") else None


def _measure(ctx: Context, qp: QuantParams) -> dict:
    key = _float_key(qp)
    if key not in ctx.references:   # ranges and adaround change only INT8 values: their FP32 is the one before
        ctx.references.clear()
        ctx.references[key] = references(ctx.graph, qp, ctx.inputs)
    return layer_sqnr(ctx.graph, qp, ctx.inputs, ctx.references[key], ctx.regions)


def _float_key(qp: QuantParams) -> str:
    """What ``measure.references`` depends on: the float weights, the channel scales, the INT8 ops (and their
    ReLU)."""
    h = hashlib.blake2b(repr([(q.node, q.relu) for q in qp.ops]).encode(), digest_size=16)
    arrays = [(f"{name}:{k}", a) for name, ws in sorted(qp.float_weights.items()) for k, a in sorted(ws.items())]
    for name, a in arrays + [(f"{name}:scale", a) for name, a in sorted(qp.channel_scales.items())]:
        a = np.ascontiguousarray(a)
        h.update(f"{name}:{a.shape}:{a.dtype}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def layer_table(record: dict) -> list[dict]:
    """One row per INT8 op of the record: its scope and output SQNR before recovery and after each step (None
    where the op was not INT8 then), then the network's row, one per compared region (``measure.REGION``) and the
    per-image figure (``measure.TYPICAL``)."""
    steps = record["steps"]
    rows = []
    regions = [k for k in record.get("before", {}) if k.startswith(REGION)]
    typical = [TYPICAL] if TYPICAL in record.get("before", {}) else []
    for node, info in (list(record["layers"].items()) + [(NETWORK, {"scope": NETWORK})]
                       + [(k, {"scope": k}) for k in regions + typical]):
        rows.append({"node": node, "scope": info["scope"], "before": record.get("before", {}).get(node),
                     **{f"{i}:{s['method']}": s["after"].get(node) for i, s in enumerate(steps)}})
    return rows
