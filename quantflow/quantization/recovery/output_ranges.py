"""Output-aware activation ranges: each INT8 op's input clip chosen by the error it causes at that op's output
(against the op's float output on the same inputs), with every op upstream in INT8 (``layerdata``), instead of by
the input tensor's own quantization error.

Candidates: the calibrated clip scaled by ``FACTORS`` (the upper end; a signed tensor's lower end too), and the
largest value the windows hold.  Ops reading one tensor share its AscendQuant, so their clip is chosen together, by
the sum of their relative output errors (squared error over FP32 energy; after the ReLU an op's Dequant carries).
The ops' int8 weights stay; scale_d, offset_d, their int32 biases and deq_scale follow the new clip (the scheme's
own functions).
"""
from __future__ import annotations

import copy
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import scheme
from .layerdata import dequantized, float_output, gathered, op_output

FACTORS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2)


def _error(q, d, xq, t) -> float:
    y = op_output(q, d, xq)
    if q.relu:
        y, t = np.maximum(y, 0), np.maximum(t, 0)
    return float(((y - t) ** 2).sum() / max(float((t ** 2).sum()), 1e-30))


def _best_clip(ops, data) -> tuple | None:
    """(the best clip, its summed relative error, the calibrated clip's) of one tensor read by ``ops``; None where
    it has no calibrated range."""
    lo0, hi0 = ops[0].stats.get("lo"), ops[0].stats.get("hi")
    if lo0 is None:
        return None
    targets = {q.node: float_output(data[q.node]) for q in ops}
    xs = {q.node: data[q.node].x.astype(np.float32) for q in ops}   # once, not per candidate
    seen = max(float(np.abs(xs[q.node]).max()) for q in ops)
    candidates = {(lo0 * f if lo0 < 0 else lo0, hi0 * f) for f in FACTORS}
    candidates.add((-seen if lo0 < 0 else lo0, seen))
    best, best_err, first = None, np.inf, None
    for lo, hi in sorted(candidates):
        scale_d, offset_d = scheme.act_qparams(lo, hi)
        err = sum(_error(q, data[q.node], dequantized(xs[q.node], scale_d, offset_d), targets[q.node])
                  for q in ops)
        if (lo, hi) == (lo0 * 1.0 if lo0 < 0 else lo0, hi0 * 1.0):
            first = err
        if err < best_err:
            best, best_err = (lo, hi), err
    return best, best_err, first


def output_ranges(ctx, qp):
    """``qp`` with each input's clip chosen at its readers' outputs, and the notes.  The tensors are weighed on
    a thread per core (NumPy's loops and BLAS let go of the GIL), each on its own: the same choices as one by one."""
    data = gathered(ctx, qp)
    g = qp.apply(ctx.graph)
    nodes = {n.name: n for n in g.nodes}
    out = copy.deepcopy(qp)
    readers: dict[str, list] = {}
    for q in out.ops:
        readers.setdefault(q.input, []).append(q)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        chosen = list(pool.map(lambda ops: _best_clip(ops, data), readers.values()))
    notes = {}
    for (tensor, ops), c in zip(readers.items(), chosen):
        if c is None:
            continue
        best, best_err, first = c
        if best is None or first is None or best_err >= first:
            continue
        lo0, hi0 = ops[0].stats["lo"], ops[0].stats["hi"]
        scale_d, offset_d = scheme.act_qparams(*best)
        for q in ops:
            node = nodes[q.node]
            bias = g.initializers[node.inputs[2]] if len(node.inputs) == 3 else None
            q.weight, q.scale_w = scheme.quantize_weight(g.initializers[node.inputs[1]], q.channel_axis, bias, scale_d)
            q.scale_d, q.offset_d = scale_d, offset_d
            q.bias = scheme.quantize_bias(bias, scale_d, q.scale_w, q.scope)
            q.deq_scale = scheme.deq_scale(scale_d, q.scale_w)
            q.stats.update(lo=float(best[0]), hi=float(best[1]), output_aware=True)
        notes[tensor] = {"ops": [q.node for q in ops], "clip_before": [lo0, hi0], "clip_after": list(best),
                         "relative_error_before": first, "relative_error_after": best_err}
    return out, {"tensors": notes, "summary": f"{len(notes)} input clip(s) moved of {len(readers)}"}
