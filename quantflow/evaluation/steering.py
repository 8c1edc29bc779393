"""The figure the recovery's check and the automatic fallback steer by: a low-variance measure of INT8 against
FP32 tied to each gated figure, with no labels (issue 36).

A gated figure counts what changes on the tuning images -- a net top-1 drop cancels flips both ways, a string
read differently is one in a hundred -- so on a few hundred images it moves by noise as much as by a layer.  The
steering figure measures every image's whole answer instead, and tells a layer that helps from one that does not:

- ``top1``: the mean KL divergence of INT8's softmax from FP32's (nats per image; the flip rate, the share of
  images whose top-1 changes, beside it).  Its ``worst_case`` -- the flip rate taken as a drop -- must also meet
  the threshold before the fallback stops (``worst_case_settled``): a net drop near zero on the tuning images
  says little where INT8 flips many of them both ways;
- ``outputs`` and task metrics: the least SQNR among the regions the gate compares (``parts.finest``: each part
  where the output is cut into parts, else the output whole) -- a detector's scores part, a recognizer's
  per-step scores (a per-step divergence of the symbol distributions was measured and steers worse: ``ctc.py``);
- a task metric with a ``steering(records)`` of its own (``task.py``), where its number fails: that figure -- the
  ``detection`` metric's, the least SQNR of the scores and of the boxes where either network scores near the
  threshold (``least_sqnr``), not at every anchor.

``helps``: a trial (one more layer in float16) helps when it lowers the steering error -- the KL divergence, or
the noise power relative to the signal (10^(-SQNR/10)) of the worst region among those the check fails on (all of
them where it fails on a number) -- by at least ``MIN_GAIN`` of it: any layer in float16 lowers it a little, and a
layer that removes less than that share of the error is not worth its INT8.  (A fall beyond the tuning images'
sampling spread -- a paired bootstrap interval above zero, the retraining's keep rule -- was tried as a further
condition and left out: steering ddddocr's captcha reader by its per-step total variation, it refused every layer,
each lowering that figure by 5-9% on 664 images, and the gate on 1200 others read CER 0.0234, against 0.0180 with
the five layers the output's SQNR keeps by the 5% rule alone.)"""
from __future__ import annotations

import math

import numpy as np

MIN_GAIN = 0.05


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    x = x - x.max(1, keepdims=True)
    return x - np.log(np.exp(x).sum(1, keepdims=True))


def kl_divergence(fp: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Per image (rows of class scores), KL(softmax(fp) || softmax(q)) in nats."""
    lp, lq = _log_softmax(fp), _log_softmax(q)
    return np.sum(np.exp(lp) * (lp - lq), 1)


def top1_steering(fp: np.ndarray, q: np.ndarray, r=None, threshold: float | None = None) -> dict:
    """The top-1 metric's steering figure over the images of ``fp`` / ``q`` (images x classes).  Given the
    bootstrap draws ``r`` and the gate's ``threshold``, also ``worst_case``: the flip rate as the drop would be
    were every flipped image a loss (a net drop never exceeds it), with its interval and whether it meets the
    threshold -- what a check on a few hundred images can promise where the net drop cancels flips both ways."""
    from .intervals import TOLERANCE, interval, mean_replicates

    kl = float(np.mean(kl_divergence(fp, q))) if len(fp) else 0.0
    flipped = (fp.argmax(1) != q.argmax(1)).astype(np.float64)
    flips = float(np.mean(flipped)) if len(fp) else 0.0
    out = {"figure": "mean KL divergence (nats)", "value": kl, "error": kl, "flip_rate": flips}
    if r is not None and threshold is not None and len(fp):
        iv = interval(mean_replicates(r, flipped), r.confidence)
        out["worst_case"] = {"figure": "flip rate (every flipped image a loss)", "value": flips, "low": iv[0],
                             "high": iv[1], "limit": float(threshold),
                             "meets": bool(flips <= threshold + TOLERANCE),
                             "decided": bool(iv[1] <= threshold + TOLERANCE)}
    return out


def worst_case_settled(report: dict, on_undecided: str) -> bool:
    """Whether a check's worst case (``top1_steering``'s, where it has one) meets the gate's limit: its interval's
    high end where ``evaluation.on_undecided = "fail"`` (the gate asks for a decided PASS), else its value."""
    w = (report.get("steering") or {}).get("worst_case")
    if not w:
        return True
    return w["decided"] if on_undecided == "fail" else w["meets"]


def region_steering(rows: list[dict]) -> dict | None:
    """The least SQNR among the finest of the outputs' and parts' rows (``outputs.region_rows``), and each of
    their SQNRs (``regions``: label -> dB, what ``helps`` compares where a check fails on some of them); None
    without rows."""
    from .parts import label

    split = {r["output"] for r in rows if r.get("part")}
    finest = [r for r in rows if r.get("part") or r["output"] not in split]
    if not finest:
        return None
    worst = min(finest, key=lambda r: r["sqnr_db"])
    db = float(worst["sqnr_db"])
    return {"figure": f"least SQNR dB ({label(worst)})", "value": db, "error": _noise(db),
            "regions": {label(r): float(r["sqnr_db"]) for r in finest}}


def least_sqnr(sums: dict) -> dict:
    """The steering figure of the least SQNR among named (noise power, signal power) sums, each name's SQNR in
    ``regions``; a region with no noise is infinitely clean."""
    def db(noise: float, signal: float) -> float:
        return math.inf if noise <= 0 else 10 * math.log10(signal / noise) if signal > 0 else -math.inf

    regions = {k: db(float(n), float(s)) for k, (n, s) in sums.items()}
    worst = min(regions, key=regions.get)
    return {"figure": f"least SQNR dB ({worst})", "value": regions[worst], "error": _noise(regions[worst]),
            "regions": regions}


def _noise(db: float) -> float:
    """The noise power relative to the signal of an SQNR in dB."""
    return 0.0 if math.isinf(db) and db > 0 else 10 ** (-db / 10)


def helps(new: dict, old: dict, labels=None, min_gain: float = MIN_GAIN) -> bool:
    """Whether steering figure ``new`` is better than ``old`` by at least ``min_gain`` of ``old``'s error.  Given
    ``labels`` (the regions a check fails on), the error is the worst among those regions where both figures
    measure them: a layer is judged by what it does to what fails, not to a region that already passes."""
    mine, theirs = new.get("regions", {}), old.get("regions", {})
    labels = [lb for lb in labels or () if lb in mine and lb in theirs]
    if labels:
        return max(_noise(mine[lb]) for lb in labels) < max(_noise(theirs[lb]) for lb in labels) * (1.0 - min_gain)
    return new["error"] < old["error"] * (1.0 - min_gain)


def line(s: dict) -> str:
    """A steering figure as text."""
    flips = f", flip rate {s['flip_rate']:.4f}" if "flip_rate" in s else ""
    return f"{s['figure']} {s['value']:.4g}{flips}"
