"""The ``outputs`` metric (detectors and other non-classification heads): the INT8 emulation against FP32 on every
network output, or on each part of it that ``evaluation.parts`` names (``parts.Region``), over all held-out images
(``runs.output_stats``): cosine similarity and the largest absolute difference (the first measures in CANN's Model
Accuracy Analyzer results: "Parameters in a Complete Model Comparison Result", CANN 8.0, hiascend.com
atlasaccuracy_16_0064), with SQNR and the worst image; passes when every gated output or part reaches its limit
(``evaluation.min_cosine``, or a part's own ``min_cosine`` / ``min_sqnr_db``) -- its bootstrap interval against
the limit, ``judged_outputs`` (docs/release-gate.md).  An output split into parts is
judged by its parts (its whole figures are shown beside them): the cosine of a tensor holding box coordinates
in pixels and scores in 0..1 is the boxes' cosine."""
from __future__ import annotations

import numpy as np

from ..quantization.deploy import quantized_graph
from .floor import energy_changed
from .intervals import resampling
from .parts import label
from .parts import regions as resolve_regions
from .protocol import Series, in_float
from .runs import Fp32Memo, output_names, output_stats
from .steering import region_steering
from .verdicts import attach, explain, mark_rows, region_figures, with_intervals


def _cosine(dot, ff, dd):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ff * dd > 0, dot / np.sqrt(ff * dd), np.where((ff == 0) & (dd == 0), 1.0, 0.0))


def network_regions(graph, limits, gate_whole: bool = True, names: dict | None = None) -> list:
    """The regions the gate compares: every output whole (gated at ``evaluation.min_cosine`` when
    ``gate_whole``) and the parts ``evaluation.parts`` names (``parts.regions``); outputs by their names as the
    user knows them (``runs.output_names``)."""
    outputs = [(n, tuple(graph.shape(o))) for n, o in zip(output_names(graph, names), graph.outputs)]
    return resolve_regions(dict(limits.parts), outputs, limits.min_cosine if gate_whole else None, limits.min_cosine)


def region_rows(stats: np.ndarray, regions: list, paths: list) -> list[dict]:
    """Each region's cosine similarity and SQNR of INT8 against FP32 over all images (``runs.output_stats``),
    its worst image and largest difference, its limits and (when it has any) whether it meets them."""
    rows = []
    for k, r in enumerate(regions):
        dot, ff, dd, ee = (float(np.sum(stats[:, k, i])) for i in range(4))
        per_image = _cosine(stats[:, k, 0], stats[:, k, 1], stats[:, k, 2])
        worst = int(np.argmin(per_image))
        cosine = float(_cosine(np.float64(dot), np.float64(ff), np.float64(dd)))
        sqnr = float(10 * np.log10(ff / ee)) if ee > 0 else float("inf")
        passed = None
        if r.gated:
            passed = bool((r.min_cosine is None or cosine >= r.min_cosine)
                          and (r.min_sqnr_db is None or sqnr >= r.min_sqnr_db))
        rows.append({"output": r.output, "part": r.part, "where": r.where, "shape": list(r.shape), "cosine": cosine,
                     "sqnr_db": sqnr, "worst_image": str(paths[worst]), "worst_image_cosine": float(per_image[worst]),
                     "max_abs_diff": float(stats[:, k, 4].max()), "min_cosine": r.min_cosine,
                     "min_sqnr_db": r.min_sqnr_db, "gate": r.gate, "passed": passed})
    return rows


def compare_outputs(stats: np.ndarray, regions: list, paths: list, min_cosine: float) -> dict:
    """The report of ``region_rows``: passes when every gated region meets its limits."""
    rows = region_rows(stats, regions, paths)
    gated = [r for r in rows if r["passed"] is not None]
    failures = [label(r) for r in gated if not r["passed"]]
    return {"images": int(len(stats)), "min_cosine": min_cosine, "outputs": rows,
            "least_cosine": min((r["cosine"] for r in gated), default=None), "failures": failures,
            "passed": not failures}


def judged_outputs(stats: np.ndarray, regions: list, paths: list, labels, limits) -> dict:
    """``compare_outputs``' report with every gated limit's interval and verdict and every row's intervals
    (``verdicts``); the bootstrap draws images within each group of ``labels``."""
    r = resampling(labels, limits.resamples, limits.seed, limits.confidence)
    report = compare_outputs(stats, regions, paths, limits.min_cosine)
    figures, draws = region_figures(report["outputs"], stats, r)
    rows = mark_rows(with_intervals(report["outputs"], stats, r), figures)
    return attach(report, figures, draws, r, limits, outputs=rows, steering=region_steering(rows))


def failing_outputs(rows: list[dict], failures: list[str]) -> list[str]:
    """The network outputs the failing rows belong to (a failing part points at its output)."""
    return list(dict.fromkeys(r["output"] for r in rows if label(r) in failures))


def limit_text(row: dict) -> str:
    """A row's limits as the report states them (``-`` for a row shown only)."""
    limits = ([f"cosine >= {row['min_cosine']:g}"] if row.get("min_cosine") is not None else []) + (
        [f"SQNR >= {row['min_sqnr_db']:g} dB"] if row.get("min_sqnr_db") is not None else [])
    if limits and row.get("gate") is False:
        return ", ".join(limits) + " (reported, not gated)"
    return ", ".join(limits) or ("judged by its parts" if row.get("split") else "-")


def mark_split(rows: list[dict]) -> list[dict]:
    """``rows`` with each whole output that has gated parts marked ``split`` (the report says it is judged by
    them)."""
    split = {r["output"] for r in rows if r["part"] and r.get("gate", True)}
    return [dict(r, split=r["part"] is None and r["output"] in split) for r in rows]


def rows_text(rows: list[dict]) -> list[str]:
    """The rows as console lines (the accuracy report as text)."""
    rows = mark_split(rows)
    shapes = [f"{o['where']} {o['shape']}" if o["part"] else str(o["shape"]) for o in rows]
    width = max([len(label(r)) + (2 if r["part"] else 0) for r in rows] + [13])
    wide = max([len(s) for s in shapes] + [5])
    lim = max([len(limit_text(o)) for o in rows] + [22])
    lines = [f"  {'output / part':<{width}} {'shape':<{wide}} {'cosine':>9} {'interval':<19} {'SQNR dB':>8} "
             f"{'interval':<13} {'max |diff|':>10}  {'limit':<{lim}} {'verdict':<9} worst image (cosine)"]
    for o, shape in zip(rows, shapes):
        name = ("  " + o["part"]) if o["part"] else o["output"]
        verdict = "" if o["passed"] is None else o.get("verdict", "PASS" if o["passed"] else "FAIL")
        lines.append(f"  {name:<{width}} {shape:<{wide}} {o['cosine']:>9.5f} {span(o, 'cosine', 5):<19} "
                     f"{o['sqnr_db']:>8.1f} {span(o, 'sqnr_db', 1):<13} {o['max_abs_diff']:>10.4g}  "
                     f"{limit_text(o):<{lim}} {verdict:<9} {o['worst_image']} ({o['worst_image_cosine']:.5f})")
    return lines


def span(row: dict, key: str, digits: int) -> str:
    """A row's interval of ``key`` (``cosine``, ``sqnr_db``) as ``[low, high]`` ("" where it has none)."""
    iv = row.get(f"{key}_interval")
    return "" if not iv else f"[{iv[0]:.{digits}f}, {iv[1]:.{digits}f}]"


def rows_details(rows: list[dict]) -> tuple[list[str], list[list]]:
    """(header, rows) of the HTML report's table of the outputs and parts."""
    return (["output", "part", "slice", "shape", "cosine", "interval", "SQNR dB", "interval", "max |diff|", "limit",
             "verdict", "worst image", "its cosine"],
            [[o["output"], o["part"] or "", o["where"], o["shape"], f"{o['cosine']:.5f}", span(o, "cosine", 5),
              f"{o['sqnr_db']:.1f}", span(o, "sqnr_db", 1), f"{o['max_abs_diff']:.4g}", limit_text(o),
              "" if o["passed"] is None else o.get("verdict", o["passed"]), o["worst_image"],
              f"{o['worst_image_cosine']:.5f}"] for o in mark_split(rows)])


def failure_text(rows: list[dict], failures: list[str]) -> str:
    """The failing outputs and parts, each with its figures and limits."""
    by_label = {label(r): r for r in rows}
    said = []
    for n in failures:
        r = by_label[n]
        what = f"part {n} of output {r['output']} {r['where']}" if r["part"] else f"output {n}"
        said.append(f"{what} (cosine {r['cosine']:.5f}, SQNR {r['sqnr_db']:.1f} dB; needs {limit_text(r)})")
    return "INT8 " + "; ".join(said) + " against FP32"


class Outputs:
    name = "outputs"
    summary_keys = ("least_cosine", "min_cosine", "failures")
    step_keys = ("least_cosine", "failures")

    def evaluate(self, ev, limits, graph, folded, qparams, aipp_params: dict, names: dict | None = None) -> dict:
        return self.checker(ev, limits, graph, folded, aipp_params, names)(qparams)

    def checker(self, ev, limits, graph, folded, aipp_params: dict, names: dict | None = None):
        """``check(qparams) -> report`` for the automatic fallback (FP32 runs beside INT8 at the first check, and
        at each where the images' outputs do not fit ``runs.Fp32Memo``); a part that does not fit fails here,
        before any run."""
        regions = network_regions(graph, limits, names=names)
        memo = Fp32Memo(graph, len(ev))

        def check(qparams) -> dict:
            stats = output_stats(ev, graph, quantized_graph(folded, qparams), aipp_params, regions, names, memo)
            return dict(judged_outputs(stats, regions, list(ev.names), ev.labels, limits),
                        changed=energy_changed(stats, regions))
        return check

    def focus(self, r: dict) -> list[str]:
        """The outputs below their limits (a failing part: its output): the fallback rolls back next the layer
        that harms them most."""
        return failing_outputs(r["outputs"], r["failures"]) if "outputs" in r else r["failures"]

    def step_line(self, st: dict) -> str:
        failing = f" (below the limit: {', '.join(st['failures'])})" if st["failures"] else ""
        return f"least cosine {st['least_cosine']:.5f}{failing}"

    def steps_series(self, steps: list[dict], gate: dict) -> Series:
        return Series([s["least_cosine"] for s in steps], gate["min_cosine"], "cosine", "least cosine")

    def steps_table(self, steps: list[dict]) -> tuple[list[str], list[list]]:
        return (["step", "layers in float16", "INT8 ops", "least cosine", "below the limit", "passed"],
                [[i, in_float(s), s["int8_ops"], f"{s['least_cosine']:.5f}", ", ".join(s.get("failures", [])),
                  s["passed"]] for i, s in enumerate(steps)])

    def table(self, r: dict) -> list[str]:
        return [f"  INT8 against FP32 on every output (or each part of it); default limit cosine >= "
                f"{r['min_cosine']:g}"] + rows_text(r["outputs"])

    def verdict(self, r: dict) -> str:
        failing = f"; failing: {', '.join(r['failures'])}" if r.get("failures") else ""
        return f"least cosine {r['least_cosine']:.5f}, evaluation.min_cosine {r['min_cosine']:g}{failing}"

    def failure(self, r: dict) -> str | None:
        return explain(r, failure_text(r["outputs"], r["failures"]) if r["failures"] else None)

    def summary_rows(self, r: dict) -> list[list]:
        return [["least cosine", f"{r['least_cosine']:.5f}"], ["required cosine (default)", f"{r['min_cosine']:g}"],
                ["failing", ", ".join(r["failures"]) or "none"]]

    def details(self, r: dict) -> tuple[str, str, list[str], list[list]]:
        return ("per-output", "Per output and part", *rows_details(r["outputs"]))
