"""The float16 floor: what the device computes with no op in INT8 -- every op in float16, the network's own float
weights (no recovery, no channel scales), AIPP as verified: what atc compiles without quantization -- against FP32,
beside INT8, on the same images.  Its distance from INT8 is the measure of the quantization (issue 43).

Every metric's report carries ``changed`` (``changed_outcomes``): per image, the task outcomes INT8 changes against
FP32 -- top-1 classes, CTC strings, boxes, pixels (a task metric's ``changed(record)`` and ``outcome``) -- or, for
metrics with no discrete outcome (``outputs``, a task function), the outputs' noise energy sum (f - q)^2.
``distance`` puts the two paths side by side:

- ``int8_changed`` / ``float16_changed``: the totals over the images;
- ``ratio`` with its paired bootstrap interval (the images drawn as the metric's figures draw them): INT8's total
  over float16's, where a count of outcomes takes float16's as at least one (``FLOOR``: float16 changing none of
  them, INT8's ratio is its own count); for noise energy the plain ratio of the sums (the noise-power ratio,
  10^((SQNR_float16 - SQNR_int8) / 10));
- ``int8_mac_share``: the share of the quantizable ops' multiply-adds that run in INT8 (``quantization.macs``).

With ``evaluation.max_vs_float16 = K`` the ratio is a gated figure (id and label ``VS_FLOAT16``, "max" K) like any
other: its verdict joins the report's (``verdicts.rejudge``), the fallback's checks on the tuning images carry it
too (``checker``), and the fallback rolls back what lowers INT8's changes most per multiply-add.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from ..quantization.qparams import QuantParams
from .intervals import Resampling, figure, interval, line, resampling, weighted_sums
from .verdicts import DRAWS, explain, rejudge

VS_FLOAT16 = "vs_float16"           # the gated figure's id and label
FLOOR = 1.0                         # float16's count of changed outcomes taken as at least this in the ratio
ENERGY = "output noise energy"      # the unit of metrics with no discrete outcome
WHAT = ("no op in INT8, the network's own float weights, the verified AIPP: what atc compiles without "
        "quantization, on the same images")


def float16_only(method: str = "float16") -> QuantParams:
    """Parameters with no op in INT8 and nothing the calibration or recovery changed: the float16-only path."""
    return QuantParams(method, [])


def changed_outcomes(unit: str, per_image) -> dict:
    """A report's ``changed``: the ``unit`` of the outcomes and their count (or energy) per image."""
    v = np.asarray(per_image, np.float64).reshape(-1)
    return {"unit": unit, "per_image": [float(x) for x in v], "total": float(v.sum())}


def energy_changed(stats: np.ndarray, regions) -> dict:
    """``changed_outcomes`` of the outputs' noise energy per image, from ``runs.region_sums``' sums (images x
    regions x 5) over ``regions``: the whole outputs (parts overlap them), every region where none is whole."""
    whole = [k for k, r in enumerate(regions) if r.part is None] or list(range(len(regions)))
    return changed_outcomes(ENERGY, stats[:, whole, 3].sum(1) if len(stats) else np.zeros(0))


def counted(unit: str) -> bool:
    """Whether ``unit`` counts outcomes (classes, strings, boxes, pixels) rather than measuring noise energy."""
    return unit != ENERGY


def ratio_draws(q: np.ndarray, f: np.ndarray, unit: str, r: Resampling) -> np.ndarray:
    """The ratio (module docstring) in every bootstrap draw of ``r``."""
    sums = weighted_sums(r.counts, np.stack([q, f], 1))
    return _ratio(sums[:, 0], sums[:, 1], unit)


def _ratio(q, f, unit: str):
    q, f = np.asarray(q, np.float64), np.asarray(f, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        if counted(unit):
            return q / np.maximum(f, FLOOR)
        return np.where(f > 0, q / np.where(f > 0, f, 1.0), np.where(q > 0, np.inf, 1.0))


def distance(int8: dict, float16: dict, labels, limits, mac: dict | None = None) -> tuple[dict, np.ndarray | None]:
    """(INT8's distance from the float16 floor -- module docstring --, the ratio's bootstrap draws) from the two
    reports' ``changed``; ``labels`` the images' classes or groups (the metric's strata), ``limits`` the
    [evaluation] settings (resamples, seed, confidence); ``mac``: ``macs.int8_share`` of the INT8 parameters."""
    a, b = int8["changed"], float16["changed"]
    q, f = np.asarray(a["per_image"]), np.asarray(b["per_image"])
    value = float(_ratio(q.sum(), f.sum(), a["unit"]))
    draws, low, high = None, None, None
    if len(q):
        r = resampling(labels, limits.resamples, limits.seed, limits.confidence)
        draws = ratio_draws(q, f, a["unit"], r)
        low, high = interval(draws, r.confidence) or (None, None)
    out = {"unit": a["unit"], "images": int(len(q)), "int8_changed": float(q.sum()), "float16_changed": float(f.sum()),
           "int8_changed_images": int(np.sum(q > 0)), "float16_changed_images": int(np.sum(f > 0)),
           "ratio": value, "low": low, "high": high, "counted": counted(a["unit"])}
    if mac is not None:
        out.update(int8_mac_share=mac["share"], int8_macs=mac["int8_macs"], macs=mac["macs"])
    return out, draws


def floor_summary(m, report: dict) -> dict:
    """What the float16-only path gives on the gate's images: its gated figures (value, interval, verdict against
    the same limits), the metric's line and its changed outcomes' total."""
    keys = {k: report[k] for k in m.step_keys if k in report}
    gated = [f for f in report.get("figures", []) if f.get("gated", True) and f["id"] != VS_FLOAT16]
    return {"what": WHAT, "verdict": report.get("verdict", "PASS" if report["passed"] else "FAIL"),
            "figure": "; ".join(line(f) for f in gated) if gated else m.step_line(keys), **keys,
            "figures": [{k: f[k] for k in ("id", "figure", "value", "low", "high", "limit", "kind", "verdict")}
                        for f in report.get("figures", []) if f["id"] != VS_FLOAT16],
            "changed": report["changed"]["total"], "unit": report["changed"]["unit"]}


def with_floor(report: dict, floor: dict, labels, limits, mac: dict | None = None) -> dict:
    """``report`` (INT8's) with ``distance`` from ``floor`` (the float16-only path's report on the same images) and,
    with ``evaluation.max_vs_float16``, the ratio as a gated figure, the verdicts judged again."""
    d, draws = distance(report, floor, labels, limits, mac)
    report["distance"] = d
    limit = getattr(limits, "max_vs_float16", None)
    if limit is not None and "figures" in report:
        what = f"INT8's changed {d['unit']} over float16's"
        fig = figure(VS_FLOAT16, VS_FLOAT16, what, d["ratio"], limit, "max",
                     draws if draws is not None else [], d["images"], limits.confidence)
        report["figures"] = [f for f in report["figures"] if f["id"] != VS_FLOAT16] + [fig]
        if draws is not None:
            report.setdefault(DRAWS, {})[VS_FLOAT16] = draws
        rejudge(report)
    return report


def price_figure(report: dict) -> dict | None:
    """The report's gated ratio (``VS_FLOAT16``, from ``evaluation.max_vs_float16``), or None."""
    return next((f for f in report.get("figures", []) if f.get("id") == VS_FLOAT16), None)


def unpriced(report: dict) -> dict:
    """``report`` judged on the metric's own figures: without the ratio's (``evaluation.max_vs_float16``), the
    verdicts judged again; ``report`` itself where it has none.  A copy: ``report`` is left as it is."""
    if price_figure(report) is None:
        return report
    return rejudge(dict(report, figures=[f for f in report["figures"] if f["id"] != VS_FLOAT16]))


def own_failure(m, report: dict) -> str | None:
    """Why the build fails: the metric's own reason on its own figures (``m.failure`` on the report without the
    ratio's figure), and the ratio's where it FAILs (or is UNDECIDED where ``evaluation.on_undecided = "fail"``)."""
    vs = price_figure(report)
    if vs is None:
        return m.failure(report)
    said = m.failure(unpriced(report))
    if vs["verdict"] == "FAIL" or (vs["verdict"] == "UNDECIDED" and report["on_undecided"] == "fail"
                                   and report["verdict"] != "FAIL"):
        d = report["distance"]
        said = "; ".join(filter(None, [said, (
            f"INT8 changes {d['int8_changed']:g} {d['unit']} against FP32 where the float16-only path changes "
            f"{d['float16_changed']:g}: " + line(vs) + " (evaluation.max_vs_float16)")]))
    return said or explain(report, None)


def checker(m, ev, limits, graph, folded, aipp_params: dict, names: dict | None = None):
    """``check(qparams) -> report``: the metric's check (``m.checker``) with ``distance`` from the float16-only path
    on the same images (run once, at the first check) and, with ``evaluation.max_vs_float16``, its gated figure;
    ``check.floor()`` the float16-only path's report."""
    from ..quantization.macs import int8_share

    base = m.checker(ev, limits, graph, folded, aipp_params, names)
    state: dict = {}

    def floor() -> dict:
        if "report" not in state:
            state["report"] = base(float16_only())
        return state["report"]

    def check(qparams) -> dict:
        report = base(qparams)
        return with_floor(report, floor(), ev.labels, limits, int8_share(folded, [q.node for q in qparams.ops]))

    check.floor = floor
    return check


def count_upper(k: float, confidence: float) -> float:
    """The exact (Garwood) upper end, at two-sided ``confidence``, of the mean of a Poisson count observed as ``k``:
    the mean under which ``k`` or fewer turn up with chance (1 - confidence) / 2 (at 95%: 3.69 for none, 5.57 for
    one).  Above 500, the normal approximation."""
    k = int(round(k))
    tail = (1.0 - confidence) / 2.0
    if k > 500:
        z = NormalDist().inv_cdf(1.0 - tail)
        return k + z * math.sqrt(k) + z * z

    def at_most_k(mean: float) -> float:
        term = total = math.exp(-mean)
        for i in range(1, k + 1):
            term *= mean / i
            total += term
        return total

    lo, hi = float(k), k + 10.0 + 10.0 * math.sqrt(k + 1)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if at_most_k(mid) > tail else (lo, mid)
    return hi


def untellable(distance: dict | None, limit: float | None, confidence: float) -> dict | None:
    """Where a check's images count too few outcomes to show its ratio (``distance``) within the release's
    ``limit`` whatever INT8 does: float16's changed count (at least ``FLOOR``) times the limit under
    ``count_upper(0)``, the most a count seen as none may stand for.  A bootstrap over the images cannot see it: in
    every draw of 64 tuning images on which INT8 changed no box the ratio reads 0, a PASS that NudeNet's YOLOv8n did
    not repeat on 400 held-out images (0 boxes on its tuning images; 11 where float16 changes 3 on the held-out
    ones).  None without a limit, for noise energy, and where no INT8 op runs (the float16-only path: 1x by
    construction); else the counts, with ``images_needed``: the images on which float16 would change enough at its
    rate here (None where it changed none)."""
    d = distance
    if limit is None or not d or not d["counted"] or d.get("int8_mac_share", 1.0) == 0:
        return None
    upper = count_upper(0, confidence)
    if limit * max(d["float16_changed"], FLOOR) >= upper:
        return None
    needed = math.ceil(upper / limit)
    return {"unit": d["unit"], "images": d["images"], "float16_changed": d["float16_changed"], "limit": float(limit),
            "float16_needed": needed, "images_needed": math.ceil(d["images"] * needed / d["float16_changed"])
            if d["float16_changed"] > 0 else None}


def report_untellable(report: dict) -> dict | None:
    """``untellable`` of a check's report, by its ``VS_FLOAT16`` figure's limit and its bootstrap's confidence."""
    vs = price_figure(report)
    return untellable(report.get("distance"), vs and vs["limit"], report.get("bootstrap", {}).get("confidence", 0.95))


def untellable_line(u: dict) -> str:
    """``untellable``'s finding in one sentence."""
    more = (f"about {u['images_needed']} images like them would show it (evaluation.tune_dir, or more of "
            f"calibration.data_dir beyond the sample)" if u["images_needed"] else
            "give evaluation.tune_dir more images (or more of calibration.data_dir beyond the sample)")
    return (f"on {u['images']} images the float16-only path changes {_n(u['float16_changed'])} {u['unit']}, too few "
            f"to show INT8 within {_n(u['limit'])}x of it whatever INT8 changes (at least {u['float16_needed']} "
            f"needed): {more}")


def fewer_changes(report: dict, before: dict, z: float = 1.645, min_gain: float = 0.05) -> bool:
    """Whether ``report`` (one more layer in float16) changes fewer task outcomes than ``before`` on the same
    images beyond their paired noise -- the mean per-image fall above ``z`` standard errors (one-sided 95%) -- and by
    at least ``min_gain`` of them (the steering figure's ``MIN_GAIN``); never for noise energy (the steering figure
    measures that).  A roll-back
    that turns many of the decisions the gate counts back to FP32's helps whatever it does to the outputs' SQNR
    (ddddocr's captcha reader: Conv_3 raised the tuning images' agreement 0.906 -> 0.969 while the output's SQNR
    moved 33.92 -> 33.94 dB)."""
    a, b = report.get("changed"), before.get("changed")
    if (not a or not b or not counted(a["unit"]) or len(a["per_image"]) != len(b["per_image"])
            or len(a["per_image"]) < 2):
        return False
    d = np.asarray(b["per_image"], np.float64) - np.asarray(a["per_image"], np.float64)
    se = float(np.std(d, ddof=1)) / np.sqrt(len(d))
    return bool(d.sum() > 0 and d.mean() > z * se and d.sum() >= min_gain * float(np.sum(b["per_image"])))


def _n(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.4g}"


def distance_line(report: dict) -> str | None:
    """INT8's distance from the float16 floor in one line (None where the report has none)."""
    d = report.get("distance")
    if not d:
        return None
    iv = "" if d["low"] is None else f" [{_n(d['low'])}, {_n(d['high'])}]"
    if d["counted"]:
        said = (f"INT8 changes {_n(d['int8_changed'])} {d['unit']} against FP32 on {d['images']} images, the "
                f"float16-only path {_n(d['float16_changed'])}: {_n(d['ratio'])}x{iv} the float16 floor"
                + (" (float16's count taken as 1)" if d["float16_changed"] < FLOOR else ""))
    else:
        said = (f"INT8's output noise energy against FP32 is {_n(d['ratio'])}x{iv} the float16-only path's on "
                f"{d['images']} images")
    if "int8_mac_share" in d:
        said += f"; INT8 runs {d['int8_mac_share']:.1%} of the multiply-adds"
    return said
