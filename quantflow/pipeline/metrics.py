"""The accuracy gate's metrics (``evaluation.metric``): what the report holds, when it passes, how it reads.

- ``top1`` (classification): top-1 of the INT8 emulation against FP32 on per-class held-out folders
  (``gate.compare``); passes when the drop is within ``evaluation.threshold`` (and no class drops more
  than ``evaluation.max_class_drop``).
- ``outputs`` (detectors and other non-classification heads): the INT8 emulation against FP32 on every
  network output over all held-out images (``gate.output_stats`` / ``gate.compare_outputs``): cosine
  similarity and the largest absolute difference (the first measures in CANN's Model Accuracy Analyzer
  results: "Parameters in a Complete Model Comparison Result", CANN 8.0, hiascend.com
  atlasaccuracy_16_0064), with SQNR and the worst image; passes when every output's cosine is at least
  ``evaluation.min_cosine``.

Each metric gives its report, its text table, a one-line verdict, the reason it failed, the HTML report's
rows and, for the automatic fallback, its check, what a failed check points at (``focus``: the outputs
the next layer is ranked on) and how each step reads, so that the stages, the build summary,
``quantflow report`` and the HTML report ask the metric instead of reading one metric's fields.
"""
from __future__ import annotations


def _pct(x: float) -> str:
    return f"{x * 100:.2f}%"


def _in_float(step: dict) -> str:
    return ", ".join(f["scope"] for f in step["float_ops"]) or "(none)"


class Top1:
    name = "top1"
    summary_keys = ("fp32_top1", "int8_top1", "drop", "threshold")  # the build summary's (latest.json)
    step_keys = ("int8_top1", "drop")                                 # each fallback step's

    def evaluate(self, cfg, graph, folded, qparams, aipp_params: dict) -> dict:
        from .gate import compare, fp32_logits, int8_logits

        fp, labels = fp32_logits(cfg, graph)
        q = int8_logits(cfg, folded, qparams, aipp_params)
        return compare(fp, q, labels, cfg.evaluation.threshold, cfg.evaluation.max_class_drop)

    def checker(self, cfg, graph, folded, aipp_params: dict):
        """``check(qparams) -> report`` for the automatic fallback: the FP32 logits computed once."""
        from .gate import compare, fp32_logits, int8_logits

        fp, labels = fp32_logits(cfg, graph)
        e = cfg.evaluation
        return lambda qparams: compare(fp, int8_logits(cfg, folded, qparams, aipp_params), labels, e.threshold,
                                       e.max_class_drop)

    def focus(self, r: dict) -> None:
        """The network outputs a failed check points at: top-1 reads the one output."""
        return None

    def step_line(self, st: dict) -> str:
        return f"INT8 top-1 {st['int8_top1']:.4f} (drop {st['drop'] * 100:.2f} points)"

    def fallback_chart(self, steps: list[dict], gate: dict) -> bytes:
        from ..report import plots
        return plots.fallback_steps([s["int8_ops"] for s in steps], [s["int8_top1"] for s in steps],
                                    gate["fp32_top1"], gate["threshold"])

    def fallback_table(self, steps: list[dict]) -> tuple[list[str], list[list]]:
        return (["step", "layers in float16", "INT8 ops", "INT8 top-1", "drop (points)", "passed"],
                [[i, _in_float(s), s["int8_ops"], _pct(s["int8_top1"]), f"{s['drop'] * 100:+.2f}", s["passed"]]
                 for i, s in enumerate(steps)])

    def table(self, r: dict) -> list[str]:
        lines = [
            f"  {'model':<8} {'top-1':>8}",
            f"  {'FP32':<8} {r['fp32_top1'] * 100:>7.2f}%",
            f"  {'INT8':<8} {r['int8_top1'] * 100:>7.2f}%",
            f"  drop {r['drop'] * 100:+.2f} points (allowed {r['threshold'] * 100:.2f}); "
            f"top-1 agreement {r['top1_agreement'] * 100:.2f}%",
            f"  {'class':<8} {'images':>6} {'FP32':>8} {'INT8':>8}",
        ]
        for c, v in r["per_class"].items():
            lines.append(f"  {c:<8} {v['images']:>6} {v['fp32_top1'] * 100:>7.2f}% {v['int8_top1'] * 100:>7.2f}%")
        for c in r.get("class_failures", []):
            v = r["per_class"][c]
            lines.append(f"  class {c} drops {(v['fp32_top1'] - v['int8_top1']) * 100:.2f} points, more than "
                         f"evaluation.max_class_drop {r['max_class_drop'] * 100:.2f}")
        return lines

    def verdict(self, r: dict) -> str:
        return (f"FP32 top-1 {r['fp32_top1']:.4f}, INT8 top-1 {r['int8_top1']:.4f}, drop {r['drop']:.4f}, "
                f"threshold {r['threshold']:g}")

    def failure(self, r: dict) -> str | None:
        if r.get("class_failures"):
            return (f"class(es) {', '.join(r['class_failures'])} lose more top-1 than evaluation.max_class_drop "
                    f"{r['max_class_drop'] * 100:.2f} points")
        if not r["passed"]:
            return (f"INT8 top-1 {r['int8_top1']:.4f} vs FP32 {r['fp32_top1']:.4f}: drop {r['drop'] * 100:.2f} "
                    f"points exceeds evaluation.threshold {r['threshold'] * 100:.2f}")
        return None

    def summary_rows(self, r: dict) -> list[list]:
        return [["FP32 top-1", _pct(r["fp32_top1"])], ["INT8 top-1", _pct(r["int8_top1"])],
                ["drop (points)", f"{r['drop'] * 100:+.2f}"], ["allowed drop (points)", f"{r['threshold'] * 100:.2f}"],
                ["top-1 agreement", _pct(r["top1_agreement"])]]

    def details(self, r: dict) -> tuple[str, str, list[str], list[list]]:
        """(section id, title, header, rows) of the HTML report's second section."""
        return ("per-class", "Per class", ["class", "images", "FP32", "INT8", "drop (points)"],
                [[c, v["images"], _pct(v["fp32_top1"]), _pct(v["int8_top1"]),
                  f"{(v['fp32_top1'] - v['int8_top1']) * 100:+.2f}"] for c, v in r["per_class"].items()])


class Outputs:
    name = "outputs"
    summary_keys = ("least_cosine", "min_cosine")
    step_keys = ("least_cosine", "failures")

    def evaluate(self, cfg, graph, folded, qparams, aipp_params: dict) -> dict:
        from .gate import compare_outputs, eval_items, output_stats

        paths, _ = eval_items(cfg)
        stats = output_stats(cfg, graph, folded, qparams, aipp_params)
        names = list(graph.outputs)
        return compare_outputs(stats, names, [graph.shape(o) for o in names],
                               [p.relative_to(cfg.root) if p.is_relative_to(cfg.root) else p for p in paths],
                               cfg.evaluation.min_cosine)

    def checker(self, cfg, graph, folded, aipp_params: dict):
        """``check(qparams) -> report`` for the automatic fallback (FP32 runs beside INT8 at each check: only
        per-image sums are kept, never the outputs)."""
        return lambda qparams: self.evaluate(cfg, graph, folded, qparams, aipp_params)

    def focus(self, r: dict) -> list[str]:
        """The outputs below the limit: the fallback rolls back next the layer that harms them most."""
        return r["failures"]

    def step_line(self, st: dict) -> str:
        failing = f" (below the limit: {', '.join(st['failures'])})" if st["failures"] else ""
        return f"least output cosine {st['least_cosine']:.5f}{failing}"

    def fallback_chart(self, steps: list[dict], gate: dict) -> bytes:
        from ..report import plots
        return plots.step_chart([s["int8_ops"] for s in steps], [s["least_cosine"] for s in steps],
                                gate["min_cosine"], "cosine", "least output cosine")

    def fallback_table(self, steps: list[dict]) -> tuple[list[str], list[list]]:
        return (["step", "layers in float16", "INT8 ops", "least output cosine", "outputs below the limit", "passed"],
                [[i, _in_float(s), s["int8_ops"], f"{s['least_cosine']:.5f}", ", ".join(s.get("failures", [])),
                  s["passed"]] for i, s in enumerate(steps)])

    def table(self, r: dict) -> list[str]:
        lines = [f"  INT8 against FP32 on every output; each needs cosine >= {r['min_cosine']:g}",
                 f"  {'output':<12} {'shape':<18} {'cosine':>9} {'SQNR dB':>8} {'max |diff|':>10}  worst image (cosine)"]
        for o in r["outputs"]:
            lines.append(f"  {o['output']:<12} {str(o['shape']):<18} {o['cosine']:>9.5f} {o['sqnr_db']:>8.1f} "
                         f"{o['max_abs_diff']:>10.4g}  {o['worst_image']} ({o['worst_image_cosine']:.5f})"
                         f"{'' if o['passed'] else '  FAIL'}")
        return lines

    def verdict(self, r: dict) -> str:
        return f"least output cosine {r['least_cosine']:.5f}, evaluation.min_cosine {r['min_cosine']:g}"

    def failure(self, r: dict) -> str | None:
        if r["passed"]:
            return None
        worst = {o["output"]: o for o in r["outputs"]}
        return ("INT8 output(s) " + ", ".join(f"{n} (cosine {worst[n]['cosine']:.5f}, SQNR {worst[n]['sqnr_db']:.1f} dB)"
                                              for n in r["failures"])
                + f" fall below evaluation.min_cosine {r['min_cosine']:g} against FP32")

    def summary_rows(self, r: dict) -> list[list]:
        return [["least output cosine", f"{r['least_cosine']:.5f}"], ["required cosine", f"{r['min_cosine']:g}"]]

    def details(self, r: dict) -> tuple[str, str, list[str], list[list]]:
        return ("per-output", "Per output",
                ["output", "shape", "cosine", "SQNR dB", "max |diff|", "worst image", "its cosine", "passed"],
                [[o["output"], o["shape"], f"{o['cosine']:.5f}", f"{o['sqnr_db']:.1f}", f"{o['max_abs_diff']:.4g}",
                  o["worst_image"], f"{o['worst_image_cosine']:.5f}", o["passed"]] for o in r["outputs"]])


METRICS = {m.name: m for m in (Top1(), Outputs())}


def metric(which) -> Top1 | Outputs:
    """The metric named ``which``, or that of an accuracy report (reports written before the metric was
    recorded are top-1)."""
    return METRICS[which if isinstance(which, str) else which.get("metric", "top1")]
