"""Learned weight rounding (AdaRound-type: Nagel et al., "Up or Down? Adaptive Rounding for Post-Training
Quantization", ICML 2020), then bias correction, per INT8 op, on the device's grid.

Each int8 weight may be its float value rounded down or up (on the op's per-output-channel symmetric grid; the
scales stay).  The rounding is chosen to reproduce the FP32 output of the op from the inputs the INT8 network feeds
it (``layerdata``): the loss of output channel o, || X q_o s_o - t_o ||^2 over the sampled windows, is a quadratic
form in q_o with the Gram matrix G = X^T X (t_o: the float weights' output on the same inputs, ``layerdata``), and it is minimized by coordinate descent over the weights (flip a
weight to its other rounding where that lowers the loss; ``Context.iterations`` passes at most, in blocks whose
updates of the gradient G q - X^T t are one matrix product each).  Unlike AdaRound's relaxed sigmoid, every step
is a valid rounding, and the loss never rises.

Bias correction then moves each output channel's int32 bias by the mean error left on the windows (float weights'
output minus INT8, in accumulator units), as in Nagel et al. 2019 sec. 4.2.  Only int8 weights and int32 biases change.
"""
from __future__ import annotations

import copy
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...progress import progress
from .layerdata import dequantized, float_output, gathered

BLOCK = 64


def round_layer(x: np.ndarray, target: np.ndarray, w: np.ndarray, scale: np.ndarray, q0: np.ndarray,
                passes: int) -> tuple[np.ndarray, float, float]:
    """(the rounding, loss before, loss after): ``x`` (P, g, K) dequantized inputs, ``target`` (P, g, O) FP32
    outputs less the bias, ``w`` (g, O, K) float weights, ``scale`` (g, O) scale_w, ``q0`` (g, O, K) the nearest
    rounding.  Each weight ends rounded down or up from w / scale."""
    xg = np.ascontiguousarray(np.transpose(x, (1, 2, 0)), dtype=np.float32)           # (g, K, P)
    gram = np.matmul(xg, np.transpose(xg, (0, 2, 1))).astype(np.float64)               # (g, K, K), BLAS
    tg = np.transpose((target / scale[None]).astype(np.float32), (1, 0, 2))            # (g, P, O)
    xt = np.matmul(xg, tg).astype(np.float64)                                          # (g, K, O)
    ratio = np.transpose(w / scale[:, :, None], (0, 2, 1)).astype(np.float64)     # (g, K, O)
    lo = np.clip(np.floor(ratio), -127, 127)
    hi = np.clip(lo + 1, -127, 127)
    q = np.transpose(q0, (0, 2, 1)).astype(np.float64)                        # (g, K, O)
    r = np.matmul(gram, q) - xt                                              # half the gradient

    def loss() -> float:
        return float(np.sum(q * (np.matmul(gram, q) - 2 * xt)))

    before = loss()
    k_all = q.shape[1]
    for _ in range(passes):
        flips = 0
        for start in range(0, k_all, BLOCK):
            blk = slice(start, min(start + BLOCK, k_all))
            rb = r[:, blk, :].copy()
            gbb = gram[:, blk, blk]
            d = np.zeros_like(rb)
            for j in range(rb.shape[1]):
                k = start + j
                alt = np.where(q[:, k, :] == lo[:, k, :], hi[:, k, :], lo[:, k, :])
                delta = alt - q[:, k, :]
                gain = 2 * delta * rb[:, j, :] + delta ** 2 * gbb[:, j, j][:, None]
                step = np.where(gain < -1e-12, delta, 0.0)
                if not step.any():
                    continue
                flips += int(np.count_nonzero(step))
                q[:, k, :] += step
                d[:, j, :] = step
                rb += gbb[:, :, j][:, :, None] * step[:, None, :]
            if d.any():
                r += np.matmul(gram[:, :, blk], d)
        if flips == 0:
            break
    return np.transpose(q, (0, 2, 1)), before, loss()


def adaround(ctx, qp):
    """``qp`` with every INT8 op's weights rounded as learned and its biases corrected, and the notes.  The ops are
    rounded on a thread per core (each learns from its own gathered inputs, and NumPy's loops and BLAS let go of
    the GIL): the same roundings as one by one."""
    data = gathered(ctx, qp)
    out = copy.deepcopy(qp)
    with progress(len(out.ops), "recovery: adaround") as bar, \
            ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        def learn(q):
            learned = _rounded(q, data[q.node], ctx.iterations)
            bar.update(1)
            return learned
        results = list(pool.map(learn, out.ops))
    layers = {}
    for q, (rounded, bias, note) in zip(out.ops, results):
        q.bias = bias
        q.weight = rounded.reshape(q.weight.shape) if q.weight.ndim == 4 else (
            rounded[0] if q.channel_axis == 0 else rounded[0].T)
        q.stats["adaround"] = True
        layers[q.node] = note
    flipped = sum(v["flipped"] for v in layers.values())
    return out, {"layers": layers, "summary": f"{flipped} weights rounded the other way over {len(layers)} ops; "
                                              f"biases corrected"}


def _rounded(q, d, passes: int):
    """(the learned int8 weights grouped (g, O, K), the corrected int32 bias, the op's note) of INT8 op ``q`` from
    its gathered data ``d`` (``layerdata``); ``q`` is left as it is."""
    g, o, _ = d.weight.shape
    scale = np.asarray(q.scale_w, np.float64).reshape(g, o)
    xq = dequantized(d.x, q.scale_d, q.offset_d)
    target = float_output(d) - d.bias.reshape(1, g, o)
    q0 = d.grouped(q.weight)
    rounded, before, after = round_layer(xq, target, d.weight, scale, q0, passes)
    rounded = rounded.astype(np.int8)
    # bias correction: the mean error left on the windows, per output channel
    y = np.transpose(np.matmul(np.transpose(xq, (1, 0, 2)), np.transpose(rounded, (0, 2, 1)).astype(np.float32)),
                     (1, 0, 2)).astype(np.float64) * scale[None]
    shift = (target.astype(np.float64) - y).mean(axis=0).reshape(-1)
    step = q.scale_d * np.asarray(q.scale_w, np.float64)
    limits = np.iinfo(np.int32)
    bias = np.clip(q.bias.astype(np.float64) + np.rint(shift / step), limits.min, limits.max).astype(np.int32)
    return rounded, bias, {"flipped": int(np.count_nonzero(rounded != q0)), "loss_before": before,
                           "loss_after": after}
