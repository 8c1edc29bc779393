"""The ``outputs`` metric (detectors and other non-classification heads): the INT8 emulation against FP32 on
every network output over all held-out images (``runs.output_stats``): cosine similarity and the largest
absolute difference (the first measures in CANN's Model Accuracy Analyzer results: "Parameters in a Complete
Model Comparison Result", CANN 8.0, hiascend.com atlasaccuracy_16_0064), with SQNR and the worst image;
passes when every output's cosine is at least ``evaluation.min_cosine``."""
from __future__ import annotations

import numpy as np

from ..quantization.deploy import quantized_graph
from .protocol import Series, in_float
from .runs import output_stats


def _cosine(dot, ff, dd):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ff * dd > 0, dot / np.sqrt(ff * dd), np.where((ff == 0) & (dd == 0), 1.0, 0.0))


def compare_outputs(stats: np.ndarray, names: list[str], shapes: list, paths: list, min_cosine: float) -> dict:
    """Each output's cosine similarity and SQNR of INT8 against FP32 over all images (``output_stats``), its
    worst image and largest difference; passes when every output's cosine is at least ``min_cosine``."""
    rows = []
    for k, name in enumerate(names):
        dot, ff, dd, ee = (float(np.sum(stats[:, k, i])) for i in range(4))
        per_image = _cosine(stats[:, k, 0], stats[:, k, 1], stats[:, k, 2])
        worst = int(np.argmin(per_image))
        cosine = float(_cosine(np.float64(dot), np.float64(ff), np.float64(dd)))
        rows.append({"output": name, "shape": list(shapes[k]), "cosine": cosine,
                     "sqnr_db": float(10 * np.log10(ff / ee)) if ee > 0 else float("inf"),
                     "worst_image": str(paths[worst]), "worst_image_cosine": float(per_image[worst]),
                     "max_abs_diff": float(stats[:, k, 4].max()), "passed": bool(cosine >= min_cosine)})
    return {"images": int(len(stats)), "min_cosine": min_cosine, "outputs": rows,
            "least_cosine": min(r["cosine"] for r in rows), "failures": [r["output"] for r in rows if not r["passed"]],
            "passed": all(r["passed"] for r in rows)}



class Outputs:
    name = "outputs"
    summary_keys = ("least_cosine", "min_cosine")
    step_keys = ("least_cosine", "failures")

    def evaluate(self, ev, limits, graph, folded, qparams, aipp_params: dict) -> dict:
        stats = output_stats(ev, graph, quantized_graph(folded, qparams), aipp_params)
        names = list(graph.outputs)
        return compare_outputs(stats, names, [graph.shape(o) for o in names], list(ev.names), limits.min_cosine)

    def checker(self, ev, limits, graph, folded, aipp_params: dict):
        """``check(qparams) -> report`` for the automatic fallback (FP32 runs beside INT8 at each check: only
        per-image sums are kept, never the outputs)."""
        return lambda qparams: self.evaluate(ev, limits, graph, folded, qparams, aipp_params)

    def focus(self, r: dict) -> list[str]:
        """The outputs below the limit: the fallback rolls back next the layer that harms them most."""
        return r["failures"]

    def step_line(self, st: dict) -> str:
        failing = f" (below the limit: {', '.join(st['failures'])})" if st["failures"] else ""
        return f"least output cosine {st['least_cosine']:.5f}{failing}"

    def steps_series(self, steps: list[dict], gate: dict) -> Series:
        return Series([s["least_cosine"] for s in steps], gate["min_cosine"], "cosine", "least output cosine")

    def steps_table(self, steps: list[dict]) -> tuple[list[str], list[list]]:
        return (["step", "layers in float16", "INT8 ops", "least output cosine", "outputs below the limit", "passed"],
                [[i, in_float(s), s["int8_ops"], f"{s['least_cosine']:.5f}", ", ".join(s.get("failures", [])),
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
