"""Activation observers and the range (clipping threshold) methods.

- ``minmax``: the observed range.
- ``percentile``: two-sided percentile clipping (a non-negative tensor keeps its floor).
- ``kl``: TensorRT's entropy calibration on |x|, guarded: it may clip at most ``kl_max_clipped``
  of the values (default 1%); a threshold clipping more is raised to the (1 - kl_max_clipped)
  quantile.  Unguarded (``kl_max_clipped = 1``) it clipped a weakly trained MobileNetV1's ReLU6
  output (range [0, 5.6]) at 0.72, cutting off 26% of the values and 29 points of top-1
  (tests/test_fallback.py).
- ``mse``: Ascend AMCT's IFMR search: from the 99.9999th-percentile range, scale the clip by 0.70,
  0.71, ... 1.30 and keep the one whose int8 quantize-dequantize error (mean squared, over the
  histogram) is least (IFMR: min/max_percentile 0.999999, search_start 0.7, search_end 1.3,
  search_step 0.01; hiascend.com torch_npu.npu_ifmr and AMCT QuantCalibrationOp docs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .scheme import QMAX, QMIN, act_qparams


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
            lo, hi = self.lo, self.hi
            if hi <= lo:
                hi = lo + 1e-12
            self.hist_signed += _histogram(x, lo, hi, self.bins)
            a = np.abs(x)
            if self.lo >= 0.0:
                # exact zeros (a ReLU's clipped half) are represented exactly by the zero point;
                # left in, their spike drives the KL search to clip the real values far too hard
                a = a[a > 0.0]
            self.hist_abs += _histogram(a, 0.0, self.amax if self.amax > 0 else 1e-12, self.bins)

    def start_histograms(self) -> None:
        if self.count == 0:
            raise RuntimeError(f"observer {self.name} saw no data in the range pass")
        self.phase = "hist"
        self.hist_signed = np.zeros(self.bins, np.int64)
        self.hist_abs = np.zeros(self.bins, np.int64)

    def range(self, method: str, percentile: float = 99.99, kl_max_clipped: float = 0.01) -> tuple[float, float]:
        """The clipping range of ``method`` (a name in ``METHODS``)."""
        m = METHODS[method]
        if m.histograms and self.hist_signed is None:
            raise RuntimeError(f"observer {self.name}: the histogram pass did not run")
        return m.range(self, percentile=percentile, kl_max_clipped=kl_max_clipped)

    def summary(self) -> dict:
        return {"min": float(self.lo), "max": float(self.hi), "values": int(self.count)}


def _histogram(x: np.ndarray, lo: float, hi: float, bins: int) -> np.ndarray:
    """Counts of ``x`` in ``bins`` equal bins over [lo, hi] (values outside go to the end bins; ``hi`` to the
    last, as np.histogram puts it).  The bin index in float32 and a bincount: 3.5x faster than np.histogram
    on a ResNet-18 activation (25 M values); float32 rounding moves about 1 value in 10^4 to the
    neighbouring bin, immaterial to a range."""
    idx = (np.asarray(x, np.float32) - np.float32(lo)) * np.float32(bins / (hi - lo))
    np.clip(idx, 0, bins - 1, out=idx)
    return np.bincount(idx.astype(np.int32), minlength=bins).astype(np.int64)


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


def abs_quantile(hist_abs: np.ndarray, amax: float, q: float) -> float:
    """The ``q`` quantile of |x| from its histogram over [0, amax] (linear inside a bin); 0 for q <= 0."""
    total = hist_abs.sum()
    if q <= 0.0 or total == 0 or amax <= 0:
        return 0.0
    cdf = np.concatenate([[0.0], np.cumsum(hist_abs) / total])
    return float(np.interp(min(q, 1.0), cdf, np.linspace(0.0, amax, len(hist_abs) + 1)))


def quantization_mse(hist: np.ndarray, lo: float, hi: float, clip_lo: float, clip_hi: float) -> float:
    """Mean squared int8 quantize-dequantize error of the histogrammed values (bins over [lo, hi],
    each at its centre) with the scheme's parameters for [clip_lo, clip_hi]."""
    return float(_mse_many(hist, lo, hi, np.array([clip_lo]), np.array([clip_hi]))[0])


def _mse_many(hist, lo, hi, clip_lo: np.ndarray, clip_hi: np.ndarray) -> np.ndarray:
    n = len(hist)
    centres = lo + (np.arange(n) + 0.5) * (hi - lo) / n
    keep = hist > 0
    x, w = centres[keep], hist[keep].astype(np.float64)
    params = [act_qparams(a, b) for a, b in zip(clip_lo, clip_hi)]
    scale = np.array([p[0] for p in params])[:, None]
    offset = np.array([p[1] for p in params], np.float64)[:, None]
    q = np.clip(np.round(x[None, :] / scale) + offset, QMIN, QMAX)
    err = ((q - offset) * scale - x[None, :]) ** 2
    return (err * w).sum(axis=1) / max(w.sum(), 1.0)


def mse_range(hist: np.ndarray, lo: float, hi: float, start: float = 0.7, stop: float = 1.3, step: float = 0.01,
              init_percentile: float = 99.9999) -> tuple[float, float]:
    """IFMR: the scaled percentile range with the least quantization error (module doc)."""
    if hi <= lo:
        return float(lo), float(hi)
    p_lo, p_hi = percentile_range(hist, lo, hi, init_percentile)
    factors = np.arange(start, stop + step / 2, step)
    cand_lo, cand_hi = np.minimum(p_lo * factors, 0.0) if p_lo < 0 else np.full(len(factors), p_lo), p_hi * factors
    best = int(np.argmin(_mse_many(hist, lo, hi, cand_lo, cand_hi)))
    return float(cand_lo[best]), float(cand_hi[best])


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


# ----------------------------------------------------------------------------- the methods, by name

def _kl_range(obs: Observer, kl_max_clipped: float, **_) -> tuple[float, float]:
    nonneg = obs.lo >= 0.0  # non-negative (e.g. after ReLU): [0, T] onto 255 steps
    t = kl_threshold(obs.hist_abs, obs.amax, num_quant_bins=255 if nonneg else 127)
    t = max(t, abs_quantile(obs.hist_abs, obs.amax, 1.0 - kl_max_clipped))
    return (0.0, t) if nonneg else (-t, t)


@dataclass(frozen=True)
class RangeMethod:
    name: str
    histograms: bool                                   # needs the second, histogram pass
    range: Callable[..., tuple[float, float]]          # (observer, percentile=, kl_max_clipped=) -> (lo, hi)


METHODS: dict[str, RangeMethod] = {m.name: m for m in (
    RangeMethod("minmax", False, lambda obs, **_: (float(obs.lo), float(obs.hi))),
    RangeMethod("percentile", True, lambda obs, percentile, **_: percentile_range(obs.hist_signed, obs.lo, obs.hi,
                                                                                  percentile)),
    RangeMethod("kl", True, _kl_range),
    RangeMethod("mse", True, lambda obs, **_: mse_range(obs.hist_signed, obs.lo, obs.hi)),
)}
