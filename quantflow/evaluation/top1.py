"""The ``top1`` metric (classification): top-1 of the INT8 emulation against FP32 on per-class held-out folders;
passes when the drop is within ``evaluation.threshold`` (and no class drops more than
``evaluation.max_class_drop``).  With ``TOP5_FROM`` classes or more the report holds top-5 beside it (shown,
not gated)."""
from __future__ import annotations

import numpy as np

from ..quantization.deploy import quantized_graph
from .floor import changed_outcomes
from .intervals import FAIL, UNDECIDED, figure, mean_replicates, resampling, subset_mean_replicates
from .outputs import region_rows, rows_text
from .parts import Region
from .power import max_changed
from .protocol import Series, in_float
from .runs import fp32_logits, int8_logits, output_names, region_sums
from .steering import top1_steering
from .verdicts import attach, explain, with_intervals

TOP5_FROM = 100   # classes from which the report shows top-5 too (ImageNet-style heads)
OUTCOME = "classes"   # what INT8 changes (``floor``): an image's top-1 class other than FP32's


def _pct(x: float) -> str:
    return f"{x * 100:.2f}%"


def _interval_of(r: dict, fid: str) -> str:
    f = next((f for f in r.get("figures", []) if f["id"] == fid), None)
    return "" if f is None or f["low"] is None else (f" (the {r['bootstrap']['confidence']:.0%} interval "
                                                     f"[{f['low'] * 100:.2f}, {f['high'] * 100:.2f}] points misses it)")


def top5(scores: np.ndarray, labels: np.ndarray) -> float:
    """The share of rows whose label is among their five highest scores (ties: the lower class first)."""
    best = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    return float(np.mean(np.any(best == labels[:, None], axis=1))) if len(labels) else 0.0


def compare(fp: np.ndarray, q: np.ndarray, labels: np.ndarray, threshold: float,
            max_class_drop: float | None = None) -> dict:
    """Top-1 of both, overall and per class (and top-5 with ``TOP5_FROM`` classes or more); passes when the
    overall drop is within ``threshold`` and, when ``max_class_drop`` is given, no class drops more than that."""
    fp_pred, q_pred = fp.argmax(1), q.argmax(1)
    fp_acc = float((fp_pred == labels).mean())
    q_acc = float((q_pred == labels).mean())
    drop = fp_acc - q_acc
    per_class = {}
    for c in np.unique(labels):
        m = labels == c
        per_class[str(int(c))] = {"images": int(m.sum()), "fp32_top1": float((fp_pred[m] == c).mean()),
                                  "int8_top1": float((q_pred[m] == c).mean())}
    scale = np.abs(fp).max() if fp.size else 1.0
    class_failures = [] if max_class_drop is None else [
        c for c, v in per_class.items() if v["fp32_top1"] - v["int8_top1"] > max_class_drop + 1e-12]
    five = {"fp32_top5": top5(fp, labels), "int8_top5": top5(q, labels)} if fp.shape[1] >= TOP5_FROM else {}
    return {
        "images": int(len(labels)),
        "fp32_top1": fp_acc,
        "int8_top1": q_acc,
        "drop": drop,
        # images whose correctness INT8 changes, each way: what a drop's interval is made of
        "lost": int(np.sum((fp_pred == labels) & (q_pred != labels))),
        "gained": int(np.sum((fp_pred != labels) & (q_pred == labels))),
        "threshold": threshold,
        "passed": bool(drop <= threshold + 1e-12) and not class_failures,
        "max_class_drop": max_class_drop,
        "class_failures": class_failures,
        "top1_agreement": float((fp_pred == q_pred).mean()),
        "max_abs_logit_diff": float(np.abs(fp - q).max()),
        "relative_logit_error": float(np.abs(fp - q).mean() / max(scale, 1e-12)),
        **five,
        "per_class": per_class,
    }



def top1_figures(fp: np.ndarray, q: np.ndarray, labels: np.ndarray, report: dict, r) -> tuple[list, dict]:
    """(the gated figures with their intervals -- the drop, and each class's drop with ``max_class_drop`` --,
    their bootstrap draws by id): paired per image (FP32 hit minus INT8 hit), stratified by class."""
    diff = (fp.argmax(1) == labels).astype(np.float64) - (q.argmax(1) == labels)
    draws = {"drop": mean_replicates(r, diff)}
    figures = [figure("drop", "drop", "top-1 drop", report["drop"], report["threshold"], "max", draws["drop"],
                      len(labels), r.confidence)]
    if report.get("max_class_drop") is not None:
        for c, v in report["per_class"].items():
            members = labels == int(c)
            fid = f"class {c} drop"
            draws[fid] = subset_mean_replicates(r, diff, members)
            figures.append(figure(fid, c, f"class {c} top-1 drop", v["fp32_top1"] - v["int8_top1"],
                                  report["max_class_drop"], "max", draws[fid], int(members.sum()), r.confidence))
    return figures, draws


def judged(fp: np.ndarray, q: np.ndarray, labels: np.ndarray, limits, output: str = "logits",
           images: list | None = None) -> dict:
    """``compare``'s report with every gated figure's interval and verdict (``verdicts.attach``: ``passed``
    follows the verdict and ``evaluation.on_undecided``), and the fidelity of the output top-1 reads (cosine and
    SQNR of INT8 against FP32 with their intervals; shown, not gated)."""
    report = compare(fp, q, labels, limits.threshold, limits.max_class_drop)
    r = resampling(labels, limits.resamples, limits.seed, limits.confidence)
    figures, draws = top1_figures(fp, q, labels, report, r)
    whole = [Region(output, output, (1,) + fp.shape[1:])]
    stats = region_sums({output: fp}, {output: q}, whole, len(fp))
    rows = with_intervals(region_rows(stats, whole, images or [""] * len(fp)), stats, r)
    report = attach(report, figures, draws, r, limits, outputs=rows,
                    steering=top1_steering(fp, q, r, limits.threshold))
    report["class_failures"] = [f["label"] for f in figures[1:] if f["verdict"] == FAIL]
    # the most images whose correctness INT8 may change (as many lost as gained) for a PASS on these images
    report["changes_allowed"] = max_changed(len(labels), limits.threshold, limits.confidence)
    report["changed"] = changed_outcomes(OUTCOME, fp.argmax(1) != q.argmax(1))
    return report


def changed_line(r: dict) -> str:
    """The images whose correctness INT8 changed, each way; for an UNDECIDED drop, beside how many a PASS on these
    images allows (``power.max_changed``): whether the images, not INT8, are what the verdict waits for."""
    said = (f"INT8 changed the correctness of {r['lost'] + r['gained']} of {r['images']} images: {r['lost']} lost, "
            f"{r['gained']} gained")
    drop = next((f for f in r.get("figures", []) if f["id"] == "drop"), None)
    if drop and drop["verdict"] == UNDECIDED and "changes_allowed" in r:
        said += (f"; a PASS on {r['images']} images allows about {r['changes_allowed']} changed, as many lost as "
                 f"gained (fewer where more are lost)")
    return said


class Top1:
    name = "top1"
    summary_keys = ("fp32_top1", "int8_top1", "drop", "threshold")  # the build summary's (latest.json)
    step_keys = ("int8_top1", "drop")                                 # each fallback step's

    def evaluate(self, ev, limits, graph, folded, qparams, aipp_params: dict, names: dict | None = None) -> dict:
        return self.checker(ev, limits, graph, folded, aipp_params, names)(qparams)

    def checker(self, ev, limits, graph, folded, aipp_params: dict, names: dict | None = None):
        """``check(qparams) -> report`` for the automatic fallback: the FP32 logits computed once."""
        fp = fp32_logits(ev, graph)
        first = output_names(graph, names)[0]
        return lambda qparams: judged(fp, int8_logits(ev, quantized_graph(folded, qparams), aipp_params), ev.labels,
                                      limits, first, list(ev.names))

    def focus(self, r: dict) -> None:
        """The network outputs a failed check points at: top-1 reads the one output."""
        return None

    def step_line(self, st: dict) -> str:
        return f"INT8 top-1 {st['int8_top1']:.4f} (drop {st['drop'] * 100:.2f} points)"

    def steps_series(self, steps: list[dict], gate: dict) -> Series:
        return Series([s["int8_top1"] * 100 for s in steps], (gate["fp32_top1"] - gate["threshold"]) * 100,
                      "top-1 (%)", "INT8 top-1", gate["fp32_top1"] * 100, "FP32 top-1")

    def steps_table(self, steps: list[dict]) -> tuple[list[str], list[list]]:
        return (["step", "layers in float16", "INT8 ops", "INT8 top-1", "drop (points)", "passed"],
                [[i, in_float(s), s["int8_ops"], _pct(s["int8_top1"]), f"{s['drop'] * 100:+.2f}", s["passed"]]
                 for i, s in enumerate(steps)])

    def table(self, r: dict) -> list[str]:
        lines = [
            f"  {'model':<8} {'top-1':>8}",
            f"  {'FP32':<8} {r['fp32_top1'] * 100:>7.2f}%",
            f"  {'INT8':<8} {r['int8_top1'] * 100:>7.2f}%",
            f"  drop {r['drop'] * 100:+.2f} points (allowed {r['threshold'] * 100:.2f}); "
            f"top-1 agreement {r['top1_agreement'] * 100:.2f}%",
        ]
        if "lost" in r:
            lines.append("  " + changed_line(r))
        if "fp32_top5" in r:
            lines.append(f"  top-5: FP32 {r['fp32_top5'] * 100:.2f}%, INT8 {r['int8_top5'] * 100:.2f}% "
                         f"(drop {(r['fp32_top5'] - r['int8_top5']) * 100:+.2f} points; shown, not gated)")
        lines.append(f"  {'class':<8} {'images':>6} {'FP32':>8} {'INT8':>8}")
        for c, v in r["per_class"].items():
            lines.append(f"  {c:<8} {v['images']:>6} {v['fp32_top1'] * 100:>7.2f}% {v['int8_top1'] * 100:>7.2f}%")
        if r.get("outputs"):
            lines += ["  fidelity of INT8 against FP32 on the output top-1 reads (shown, not gated):"] + rows_text(
                r["outputs"])
        for c in r.get("class_failures", []):
            v = r["per_class"][c]
            lines.append(f"  class {c} drops {(v['fp32_top1'] - v['int8_top1']) * 100:.2f} points, more than "
                         f"evaluation.max_class_drop {r['max_class_drop'] * 100:.2f}")
        return lines

    def verdict(self, r: dict) -> str:
        five = (f" (top-5 FP32 {r['fp32_top5']:.4f}, INT8 {r['int8_top5']:.4f})" if "fp32_top5" in r else "")
        return (f"FP32 top-1 {r['fp32_top1']:.4f}, INT8 top-1 {r['int8_top1']:.4f}, drop {r['drop']:.4f}, "
                f"threshold {r['threshold']:g}{five}")

    def failure(self, r: dict) -> str | None:
        own = []
        if r.get("class_failures"):
            own.append(f"class(es) {', '.join(r['class_failures'])} lose more top-1 than evaluation.max_class_drop "
                       f"{r['max_class_drop'] * 100:.2f} points")
        if "drop" in r.get("failures", ["drop"] if not r["passed"] else []):
            own.append(f"INT8 top-1 {r['int8_top1']:.4f} vs FP32 {r['fp32_top1']:.4f}: drop {r['drop'] * 100:.2f} "
                       f"points exceeds evaluation.threshold {r['threshold'] * 100:.2f}" + _interval_of(r, "drop"))
        return explain(r, "; ".join(own) or None)

    def summary_rows(self, r: dict) -> list[list]:
        five = [["FP32 top-5", _pct(r["fp32_top5"])], ["INT8 top-5", _pct(r["int8_top5"])]] if "fp32_top5" in r else []
        return [["FP32 top-1", _pct(r["fp32_top1"])], ["INT8 top-1", _pct(r["int8_top1"])],
                ["drop (points)", f"{r['drop'] * 100:+.2f}"], ["allowed drop (points)", f"{r['threshold'] * 100:.2f}"],
                ["top-1 agreement", _pct(r["top1_agreement"])]] + five + (
            [["correctness changed by INT8", changed_line(r)]] if "lost" in r else [])

    def details(self, r: dict) -> tuple[str, str, list[str], list[list]]:
        """(section id, title, header, rows) of the HTML report's second section."""
        return ("per-class", "Per class", ["class", "images", "FP32", "INT8", "drop (points)"],
                [[c, v["images"], _pct(v["fp32_top1"]), _pct(v["int8_top1"]),
                  f"{(v['fp32_top1'] - v['int8_top1']) * 100:+.2f}"] for c, v in r["per_class"].items()])
