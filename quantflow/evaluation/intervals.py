"""Bootstrap intervals and the three verdicts of every gated figure (docs/release-gate.md).

A figure (a top-1 drop, an output's or part's cosine or SQNR, a task metric's number) is measured on the
held-out images; how sure the gate is of it comes from a paired bootstrap over those images: ``resamples`` times
the images are drawn with replacement -- within each class (or group) as many as it holds, a stratified bootstrap
-- and the figure recomputed on the draw, FP32 and INT8 of an image always drawn together.  The percentile
interval at ``confidence`` of the recomputed figures is the figure's interval.  Draws are seeded
(``evaluation.seed``): the same images and seed give the same draws, so the intervals are reproducible and two
builds on the same images are paired draw by draw (``baseline``).

Verdicts against a limit the figure must reach (``kind`` "min": value >= limit) or stay under ("max"):
PASS when the whole interval meets the limit, FAIL when none of it does, UNDECIDED when it straddles the limit.
An UNDECIDED figure says how many held-out images would likely decide it (``decide_images``): the interval's
half-width on the limit's side scales as 1/sqrt(n), so n' = n (h / d)^2 images shrink it to the distance d
between the figure and its limit.

Figures are recomputed cheaply from per-image data: ``mean_replicates`` (per-image values: top-1 hits, a task
function's values), ``region_replicates`` (``runs.region_sums``' per-image sums, re-summed per draw) and
``record_replicates`` (a task metric's per-image or per-batch records, summarized per draw).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

PASS, FAIL, UNDECIDED = "PASS", "FAIL", "UNDECIDED"
TOLERANCE = 1e-12   # a figure on its limit meets it (float sums in another order)


@dataclass(frozen=True)
class Resampling:
    """The bootstrap draws: ``counts[b, i]`` is how often image (or batch) i is in draw b."""
    counts: np.ndarray
    confidence: float
    seed: int

    @property
    def resamples(self) -> int:
        return len(self.counts)

    def settings(self) -> dict:
        """What a report records so that a later build can pair with it."""
        return {"confidence": self.confidence, "resamples": self.resamples, "seed": self.seed}


def resampling(labels, resamples: int, seed: int, confidence: float) -> Resampling:
    """Stratified draws over images labelled ``labels`` (class or group per image): in every draw each label
    keeps its image count.  ``numpy.random.default_rng(seed)``, labels in sorted order: the same on any machine."""
    labels = np.asarray(labels)
    # uint8: a count above 255 in a draw of images is beyond any float's resolution of chance; 1000 draws of
    # 50,000 images take 50 MB (the sums below read them a block of draws at a time)
    counts = np.zeros((resamples, len(labels)), np.uint8)
    rng = np.random.default_rng(int(seed))
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        counts[:, members] = rng.multinomial(len(members), np.full(len(members), 1.0 / len(members)), resamples)
    return Resampling(counts, float(confidence), int(seed))


def interval(replicates, confidence: float) -> tuple[float, float] | None:
    """The percentile interval of ``replicates`` at ``confidence`` (draws where the figure is not measured --
    NaN -- left out); None when no draw measured it."""
    r = np.sort(np.asarray([np.nan if v is None else v for v in np.ravel(replicates)], np.float64))
    r = r[~np.isnan(r)]
    if not len(r):
        return None
    # the order statistics on either side, not interpolated (an exact draw's SQNR is infinite)
    alpha = 1.0 - confidence
    return float(r[math.floor(alpha / 2 * (len(r) - 1))]), float(r[math.ceil((1 - alpha / 2) * (len(r) - 1))])


def verdict(low: float, high: float, limit: float, kind: str) -> str:
    """PASS (the interval meets the limit), FAIL (none of it does) or UNDECIDED (it straddles the limit)."""
    if kind == "min":
        return PASS if low >= limit - TOLERANCE else FAIL if high < limit - TOLERANCE else UNDECIDED
    return PASS if high <= limit + TOLERANCE else FAIL if low > limit + TOLERANCE else UNDECIDED


def decide_images(value: float, low: float, high: float, limit: float, n: int) -> int | None:
    """Held-out images that would likely decide an UNDECIDED figure: the interval's half-width h on the limit's
    side shrinks as 1/sqrt(n), to the distance d of the figure from its limit at n (h / d)^2 images; None when
    the figure sits on its limit (no number of images decides it)."""
    d = abs(value - limit)
    h = (value - low) if value >= limit else (high - value)
    if d <= TOLERANCE or not math.isfinite(h):
        return None
    return max(n + 1, math.ceil(n * (max(h, 0.0) / d) ** 2))


def figure(fid: str, label: str, what: str, value, limit: float, kind: str, replicates, n: int,
           confidence: float, gated: bool = True) -> dict:
    """A figure with its interval and verdict: ``fid`` its id (unique in a report), ``label`` what a failure
    points at (an output, part or number: the metric's ``failures``), ``what`` its name in the report."""
    value = None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)
    iv = interval(replicates, confidence)
    f = {"id": fid, "label": label, "figure": what, "value": value, "kind": kind, "limit": float(limit),
         "low": iv[0] if iv else None, "high": iv[1] if iv else None, "gated": gated}
    if value is None:
        f.update(verdict=FAIL, decide_images=None)   # not measured: the limit is not met
    elif iv is None:
        v = verdict(value, value, limit, kind)
        f.update(verdict=v, decide_images=None)
    else:
        v = verdict(f["low"], f["high"], limit, kind)
        f.update(verdict=v, decide_images=decide_images(value, f["low"], f["high"], limit, n) if v == UNDECIDED
                 else None)
    return f


def overall(figures: list[dict]) -> str:
    """FAIL if any gated figure fails (or is worse than the baseline), else UNDECIDED if any is, else PASS."""
    verdicts = [f["verdict"] for f in figures if f.get("gated", True)]
    worse = any(f.get("baseline", {}).get("worse") for f in figures)
    return FAIL if worse or FAIL in verdicts else UNDECIDED if UNDECIDED in verdicts else PASS


def passes(v: str, on_undecided: str) -> bool:
    """Whether a build with verdict ``v`` passes (``evaluation.on_undecided`` decides UNDECIDED)."""
    return v == PASS or (v == UNDECIDED and on_undecided != "fail")


def settled(v: str, on_undecided: str = "pass") -> bool:
    """The automatic fallback's stopping rule on the tuning images: the verdict ``v`` the gate would pass there.
    With ``evaluation.on_undecided = "fail"`` only a PASS (the gate fails an UNDECIDED verdict: a roll-back that
    stopped there would hand the gate a build it expects to fail); otherwise no figure FAILs (an UNDECIDED figure
    is within sampling noise of its limit, and rolling another layer back for it would chase noise).  Past an
    UNDECIDED check the fallback goes on only while each layer brings the figures closer (``shortfall``)."""
    return v == PASS if on_undecided == "fail" else v != FAIL


Z95 = 1.96   # the normal quantile of a two-sided 95% interval (expected_pass)
MISS = 1.0 - NormalDist().cdf(1.0)   # how often a build expected to PASS may miss it at the gate: one in six


def margin(looks: int = 1) -> float:
    """How many standard deviations of the tuning-to-gate difference a figure must clear after ``looks`` checks of
    the same tuning images: 1 for the first, then the normal quantile of 1 - MISS / looks (Bonferroni over the
    looks; 1.6 at the third, 1.9 at the sixth).  A search that stops at the first check to clear a fixed margin
    stops where the tuning images' noise happened to favour INT8, and the more checks it makes the likelier that
    is: on ddddocr's captcha reader the fallback's sixth check read CER 0.0148 on its 664 tuning images, cleared
    one deviation, and the gate read 0.0187 [0.0168, 0.0205] on 4800 others, UNDECIDED (docs/release-gate.md)."""
    return NormalDist().inv_cdf(1.0 - MISS / max(1, looks))


def expected_pass(figures: list[dict], images: int, gate_images: int, looks: int = 1) -> bool:
    """Whether the gated ``figures``, measured on ``images`` tuning images, can be expected to PASS on the gate's
    ``gate_images`` others.  The gate PASSes a figure when its own interval's end is within the limit: g, the
    tuning interval's half-width h on the limit's side scaled to the gate's image count (h sqrt(images /
    gate_images)), past the value the gate measures; that value differs from the tuning one by sampling, with a
    standard deviation of about sqrt(h^2 + g^2) / z.  So each figure's value, moved towards its limit by
    g + margin(looks) sqrt(h^2 + g^2) / z (z = 1.96; at the first check one deviation: the gate PASSes about five
    times in six, and ``margin`` keeps that over ``looks`` checks), must still meet the limit.  A tuning check
    just inside its limit hands the gate a figure it cannot decide."""
    k = margin(looks)
    for f in figures:
        if not f.get("gated", True) or f["value"] is None or f["low"] is None:
            continue
        h = (f["high"] - f["value"]) if f["kind"] == "max" else (f["value"] - f["low"])
        g = h * math.sqrt(images / gate_images) if gate_images else 0.0
        reach = g + k * math.sqrt(h * h + g * g) / Z95
        if (f["value"] + reach > f["limit"] + TOLERANCE) if f["kind"] == "max" else \
                (f["value"] - reach < f["limit"] - TOLERANCE):
            return False
    return True


def shortfall(figures: list[dict]) -> float:
    """How far the gated ``figures`` are from meeting their limits: for each, the distance past its limit of the
    bound that decides a PASS (the interval's low end for a minimum, high end for a maximum; the value where
    there is no interval; infinite where it is not measured), relative to the limit (absolute for a limit of 0),
    summed.  0 when every gated figure PASSes."""
    total = 0.0
    for f in figures:
        if not f.get("gated", True):
            continue
        bound = f["value"] if f["low"] is None else f["low"] if f["kind"] == "min" else f["high"]
        if bound is None:
            return math.inf
        past = (f["limit"] - bound) if f["kind"] == "min" else (bound - f["limit"])
        total += max(0.0, past) / (abs(f["limit"]) or 1.0)
    return total


def number(v) -> str:
    return "n/a" if v is None else f"{v:.6g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3e}"


def line(f: dict) -> str:
    """A figure as one line: value, interval, limit, verdict (and the images that would decide it)."""
    iv = "" if f["low"] is None else f" [{number(f['low'])}, {number(f['high'])}]"
    need = ">=" if f["kind"] == "min" else "<="
    said = f"{f['figure']} {number(f['value'])}{iv} (needs {need} {f['limit']:g}): {f['verdict']}"
    if f["verdict"] == UNDECIDED:
        said += (f", about {f['decide_images']} held-out images would likely decide it" if f["decide_images"]
                 else ", on its limit")
    b = f.get("baseline")
    if b:
        diff = "" if b.get("low") is None else f", difference [{number(b['low'])}, {number(b['high'])}]"
        said += (f"; against the baseline {number(b['value'])}: "
                 f"{'WORSE' if b['worse'] else 'not worse'} ({b['method']}{diff})")
    return said


# ----------------------------------------------------------------------------------------------- replicates
BLOCK = 64   # draws whose counts are turned into floats at a time


def weighted_sums(counts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``counts @ values`` (draws x images times images x k, float64), a block of draws at a time."""
    out = np.empty((len(counts), values.shape[1]))
    for s in range(0, len(counts), BLOCK):
        out[s:s + BLOCK] = counts[s:s + BLOCK].astype(np.float64) @ values
    return out


def mean_replicates(r: Resampling, values) -> np.ndarray:
    """The mean of per-image ``values`` (images first; any further axes kept) in every draw."""
    v = np.asarray(values, np.float64)
    total = np.maximum(r.counts.sum(1, dtype=np.int64), 1)[:, None]
    return (weighted_sums(r.counts, v.reshape(len(v), -1)) / total).reshape((r.resamples,) + v.shape[1:])


def subset_mean_replicates(r: Resampling, values, members) -> np.ndarray:
    """The mean of per-image ``values`` over the images ``members`` (a boolean mask) in every draw."""
    m = np.asarray(members, bool)
    c = r.counts[:, m]
    with np.errstate(invalid="ignore", divide="ignore"):
        return weighted_sums(c, np.asarray(values, np.float64)[m][:, None])[:, 0] / c.sum(1, dtype=np.int64)


def region_replicates(r: Resampling, stats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cosine, SQNR dB) of every region in every draw (draws x regions), from ``runs.region_sums``' per-image
    sums (images x regions x 5), re-summed over each draw's images."""
    n, regions = stats.shape[:2]
    sums = weighted_sums(r.counts, stats[:, :, :4].reshape(n, -1)).reshape(r.resamples, regions, 4)
    dot, ff, dd, ee = (sums[..., i] for i in range(4))
    with np.errstate(divide="ignore", invalid="ignore"):
        cosine = np.where(ff * dd > 0, dot / np.sqrt(ff * dd), np.where((ff == 0) & (dd == 0), 1.0, 0.0))
        sqnr = np.where(ee > 0, 10 * np.log10(ff / ee), np.inf)
    return cosine, sqnr


def record_replicates(r: Resampling, records: list, summarize) -> list[dict]:
    """``summarize`` of each draw of ``records`` (one per image, or per batch with a batch resampling)."""
    index = np.arange(len(records))
    return [summarize([records[i] for i in np.repeat(index, c)]) for c in r.counts]
