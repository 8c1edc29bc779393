"""Activation observers and the range (clipping threshold) methods: min-max, percentile, KL-entropy."""
from __future__ import annotations

import numpy as np


class Observer:
    """Collects the statistics of one activation tensor over the calibration set.

    Two passes: the first records min/max; the second fills histograms over the range found
    in the first (a signed one over [min, max], for percentiles, and one of |x| over
    [0, max|x|], for the KL-entropy method).
    """

    def __init__(self, name: str, bins: int = 2048):
        self.name = name
        self.bins = bins
        self.lo = np.inf
        self.hi = -np.inf
        self.count = 0
        self.phase = "range"
        self.hist_signed: np.ndarray | None = None
        self.hist_abs: np.ndarray | None = None

    @property
    def amax(self) -> float:
        return float(max(abs(self.lo), abs(self.hi)))

    def observe(self, x) -> None:
        x = np.asarray(x).ravel()
        if x.size == 0:
            return
        if self.phase == "range":
            lo, hi = float(x.min()), float(x.max())  # NaN propagates through min/max; Inf shows in them
            if not (np.isfinite(lo) and np.isfinite(hi)):
                raise FloatingPointError(
                    f"observer {self.name}: non-finite activations (NaN/Inf) in the calibration run")
            self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
            self.count += x.size
        else:
            x = x.astype(np.float64)
            lo, hi = self.lo, self.hi
            if hi <= lo:
                hi = lo + 1e-12
            self.hist_signed += np.histogram(np.clip(x, lo, hi), bins=self.bins, range=(lo, hi))[0]
            amax = self.amax if self.amax > 0 else 1e-12
            a = np.abs(x)
            if self.lo >= 0.0:
                # exact zeros (a ReLU's clipped half) are represented exactly by the zero point;
                # left in, their spike drives the KL search to clip the real values far too hard
                a = a[a > 0.0]
            self.hist_abs += np.histogram(np.minimum(a, amax), bins=self.bins, range=(0.0, amax))[0]

    def start_histograms(self) -> None:
        if self.count == 0:
            raise RuntimeError(f"observer {self.name} saw no data in the range pass")
        self.phase = "hist"
        self.hist_signed = np.zeros(self.bins, np.int64)
        self.hist_abs = np.zeros(self.bins, np.int64)

    # ------------------------------------------------------------------ ranges
    def range(self, method: str, percentile: float = 99.99) -> tuple[float, float]:
        if method == "minmax":
            return float(self.lo), float(self.hi)
        if self.hist_signed is None:
            raise RuntimeError(f"observer {self.name}: the histogram pass did not run")
        if method == "percentile":
            return percentile_range(self.hist_signed, self.lo, self.hi, percentile)
        if method == "kl":
            if self.lo >= 0.0:  # non-negative (e.g. after ReLU): [0, T] onto 255 steps
                t = kl_threshold(self.hist_abs, self.amax, num_quant_bins=255)
                return 0.0, t
            t = kl_threshold(self.hist_abs, self.amax, num_quant_bins=127)
            return -t, t
        raise ValueError(f"unknown calibration method {method!r}")

    def summary(self) -> dict:
        return {"min": float(self.lo), "max": float(self.hi), "values": int(self.count)}


def percentile_range(hist: np.ndarray, lo: float, hi: float, pct: float) -> tuple[float, float]:
    """Two-sided percentile clipping from a histogram over [lo, hi] (linear inside a bin)."""
    if hi <= lo:
        return float(lo), float(hi)
    total = hist.sum()
    edges = np.linspace(lo, hi, len(hist) + 1)
    cdf = np.concatenate([[0.0], np.cumsum(hist) / total])

    def at(q: float) -> float:
        return float(np.interp(q, cdf, edges))

    tail = (100.0 - pct) / 100.0
    r_lo = float(lo) if lo >= 0.0 else at(tail)  # non-negative data keeps its floor
    return r_lo, at(1.0 - tail)


def _smooth(p: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    """Give empty bins a small mass taken evenly from the others (as TensorRT/MXNet do)."""
    zero = p == 0
    nz = p.size - zero.sum()
    if nz == 0:
        return p
    eps1 = eps * zero.sum() / nz
    return p + eps * zero - eps1 * (~zero)


def kl_threshold(hist: np.ndarray, amax: float, num_quant_bins: int = 127) -> float:
    """TensorRT-style entropy calibration: the |x| threshold whose quantized distribution loses
    the least information (KL divergence) against the clipped reference distribution.

    ``hist`` covers [0, amax] in equal bins.
    """
    hist = np.asarray(hist, np.float64)
    nbins = len(hist)
    if amax <= 0 or hist.sum() == 0:
        return float(max(amax, 1e-12))
    width = amax / nbins
    if nbins <= num_quant_bins:
        return float(amax)
    best_kl, best_i = np.inf, nbins
    csum = np.cumsum(hist[::-1])[::-1]  # csum[i] = hist[i:].sum()
    for i in range(num_quant_bins, nbins + 1):
        ref = hist[:i].copy()
        if i < nbins:
            ref[i - 1] += csum[i]
        nonzero = ref != 0
        # merge hist[:i] into num_quant_bins chunks, spread back evenly over the non-empty bins
        starts = (np.arange(num_quant_bins) * i) // num_quant_bins
        sliced = hist[:i]
        totals = np.add.reduceat(sliced, starts)
        counts = np.add.reduceat(nonzero.astype(np.float64), starts)
        chunk = np.repeat(np.arange(num_quant_bins), np.diff(np.append(starts, i)))
        with np.errstate(divide="ignore", invalid="ignore"):
            per_bin = np.where(counts > 0, totals / np.maximum(counts, 1), 0.0)
        q = np.where(nonzero, per_bin[chunk], 0.0)
        p = ref / ref.sum()
        qs = q.sum()
        if qs == 0:
            continue
        q = _smooth(q / qs)
        p = _smooth(p)
        mask = p > 0
        if np.any(q[mask] <= 0):
            continue
        kl = float(np.sum(p[mask] * np.log(p[mask] / q[mask])))
        if kl < best_kl:
            best_kl, best_i = kl, i
    return float(best_i * width)
