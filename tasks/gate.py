"""gate: the accuracy verdict on the final INT8 parameters: the INT8 emulation (each uint8 held-out image through
the verified AIPP config) against FP32, judged by ``evaluation.metric`` (``quantflow.evaluation``); the accuracy
report and the HTML build report, written before a failure is raised, so a failing build has its report too.

Every gated figure has a bootstrap interval and a verdict (PASS, FAIL, UNDECIDED: ``evaluation.on_undecided``),
against ``evaluation.baseline`` too where given; the gate also writes the figures' draws (a later build pairs with
them), JUnit XML and a Markdown summary for CI (docs/release-gate.md).

With ``quantization.fallback = "auto"`` the gate judges images the fallback did not tune on
(``fallback.tuning_and_gate_sets``: by default every held-out image, the fallback tuning on calibration images;
checked against the tuning images ``fallback.json`` records), and the report shows both figures.  Every report puts
INT8 beside the float16 floor (``evaluation.floor``): the same images through the device's float16-only path (no op
in INT8, the network's own float weights), its figures, the outcomes each path changes against FP32, their ratio
with an interval and INT8's share of the multiply-adds (``float16`` and ``distance`` in accuracy_report.json); with
``evaluation.max_vs_float16`` the ratio is gated."""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np

from quantflow.backends.atc import precision_note
from quantflow.engine import shard
from quantflow.errors import AccuracyGateError, DataError
from quantflow.evaluation import baseline, floor
from quantflow.evaluation.intervals import UNDECIDED, line
from quantflow.evaluation.verdicts import DRAWS, rejudge
from quantflow.io.atomic import write_json, write_text
from quantflow.io.digest import file_sha256
from quantflow.io.files import JUNIT_XML, REPORT_DRAWS, REPORT_HTML, REPORT_JSON, REPORT_TXT, SUMMARY_MD
from quantflow.quantization.qparams import QuantParams
from quantflow.report import ci

from . import retrain
from . import sensitivity as analysis
from .aipp import read_params
from .calibrate import load_histograms
from .fallback import FALLBACK_JSON, evaluation_inputs, ranked, tuning_and_gate_sets, tuning_folder
from .inputs import output_names, parameters_dir, read_graph
from .recover import read as read_recovery
from .stage import Stage

GATE_FILES = (REPORT_JSON, REPORT_TXT, REPORT_HTML, REPORT_DRAWS, JUNIT_XML, SUMMARY_MD)
ADVICE_LAYERS = 5   # the most sensitive layers a failing gate names


def gate_stage(cfg, kdir: Path, graph_dir: Path, calibrate_dir: Path, fallback_dir: Path, aipp_dir: Path,
               sensitivity, retrain_dir: Path | None = None, recover_dir: Path | None = None,
               params_dir: Path | None = None) -> dict:
    """The verdict, its reports, and on a failure an AccuracyGateError naming the layers to try.
    ``sensitivity(run)``: the per-layer analysis, or None where it has not run; with ``run`` true it is run first
    where it has not (a failing gate's message and report name the most sensitive layers).  ``params_dir``: the
    parameters the fallback started from (with ``evaluation.max_vs_float16``, its walk is measured on the gate's
    images: ``held_out_curve``)."""
    from quantflow.evaluation.metrics import metric
    from quantflow.quantization.passes import fold_for_quantization
    from quantflow.report import html
    from quantflow.report.text import format_table

    kdir = Path(kdir)
    graph = read_graph(cfg, graph_dir)
    qp = QuantParams.load(fallback_dir)
    fallback = json.loads((Path(fallback_dir) / FALLBACK_JSON).read_text())
    _, ev, _ = tuning_and_gate_sets(cfg)
    tuning = _tuning(cfg, fallback, ev)
    print(f"gate: FP32 and INT8 on {len(ev)} held-out images{' not tuned on' if tuning else ''} "
          f"{shard.where(cfg.engine)}")
    m = metric(cfg.evaluation.metric)
    folded, aipp_params, names = fold_for_quantization(graph), read_params(aipp_dir), output_names(cfg, graph)
    check = floor.checker(m, ev, cfg.evaluation, graph, folded, aipp_params, names)
    report = check(qp)
    print("gate: the same images through the float16-only path (no op in INT8), the floor INT8 is measured against")
    report["float16"] = floor.floor_summary(m, check.floor())
    if cfg.evaluation.max_vs_float16 is not None and params_dir is not None and fallback.get("mode") == "auto":
        report["curve"] = held_out_curve(check, QuantParams.load(params_dir), fallback["steps"], report)
    report.update(metric=m.name, eval_data=str(cfg.evaluation.data_dir), calibration_method=qp.method,
                  quantized_ops=len(qp.ops), int8_op_types=dict(Counter(op.op for op in qp.ops)),
                  float16_layers=[{"layer": f.scope, "op": f.op, "reason": f.reason} for f in qp.float16])
    note = precision_note(cfg.build.precision_mode)
    if note:
        report["precision_note"] = note
    if tuning:
        report.update(tuning=tuning, judged=list(ev.names))
        easier = easier_tuning(tuning.get("steering"), report.get("steering"))
        if easier:
            tuning["note"] = easier
            print(f"gate: note: {easier}")
    draws = report.pop(DRAWS, {})
    report["held_out"] = held_out_images(ev, fallback)
    if cfg.evaluation.baseline is not None:
        base, base_draws, where = baseline.load(cfg.path(cfg.evaluation.baseline))
        rejudge(baseline.compare(report, draws, base, base_draws, where))
    write_json(kdir / REPORT_JSON, report, sort_keys=False)
    write_draws(kdir / REPORT_DRAWS, draws)
    write_text(kdir / REPORT_TXT, format_table(report) + "\n")
    write_text(kdir / JUNIT_XML, ci.junit(report))
    write_text(kdir / SUMMARY_MD, ci.markdown(report))
    print(format_table(report))
    failure = floor.own_failure(m, report)
    if failure:
        print(f"gate: {failure}")
    elif report.get("verdict") == UNDECIDED and cfg.evaluation.on_undecided == "warn":
        print("gate: WARNING: UNDECIDED, passed as evaluation.on_undecided = \"warn\" says: "
              + "; ".join(line(f) for f in report["figures"] if f["verdict"] == UNDECIDED))
    layers = sensitivity(bool(failure))
    if layers is not None and failure:
        # what fails the build: the figures that FAIL, are worse than the baseline, or are UNDECIDED
        failing = list(dict.fromkeys(report.get("failures", []) + report.get("worse", [])
                                     + report.get("undecided", [])))
        layers = ranked(layers, m, output_names(cfg, graph), dict(report, failures=failing))
    html.write(kdir / REPORT_HTML, f"quantflow build report: {cfg.model.entry or cfg.model.mindir or cfg.model.onnx}",
               report, layers, load_histograms(calibrate_dir, QuantParams.load(calibrate_dir)), fallback,
               retrain.read(retrain_dir) if retrain_dir else None,
               read_recovery(recover_dir) if recover_dir else None)
    print(f"build report: {kdir / REPORT_HTML}")
    if failure:
        raise AccuracyGateError(f"{failure}{_advice(layers, qp, cfg)} (report: {kdir / REPORT_HTML})")
    return report


CURVE_POINTS = 8   # the fallback's kept steps measured on the gate's images at most (the first and last always)


def held_out_curve(check, params: QuantParams, steps: list[dict], final: dict) -> list[dict]:
    """The price of the fallback's walk on the gate's images: for its kept steps (at most ``CURVE_POINTS``, spread
    evenly, the first and the last among them), the layers in float16, INT8's share of the multiply-adds, the
    outcomes INT8 changes and its ratio to the float16 floor, each step's parameters (``params`` without its layers)
    run through ``check`` (``floor.checker``); the last kept step is the build's own parameters, whose report
    ``final`` the gate has made already."""
    from quantflow.quantization.fallback import without

    kept = [s for s in steps if not s.get("undone")]
    if len(kept) < 2:
        return []
    chosen = sorted({round(i * (len(kept) - 1) / (CURVE_POINTS - 1)) for i in range(CURVE_POINTS)})
    points = []
    for k in chosen:
        layers = [f["node"] for f in kept[k]["float_ops"]]
        if k == len(kept) - 1:
            r = final
        else:
            print(f"gate: the fallback's step with {len(layers)} layer(s) in float16, on the gate's images")
            r = check(without(params, layers))
        d = r["distance"]
        points.append({"float16_layers": len(layers), "int8_mac_share": d.get("int8_mac_share"),
                       "changed": d["int8_changed"], "ratio": d["ratio"], "low": d["low"], "high": d["high"],
                       "verdict": r.get("verdict", "PASS" if r["passed"] else "FAIL")})
    return points


def held_out_images(ev, fallback: dict) -> dict:
    """Which images the gate judged (names and content hashes, in order: what a baseline is checked and paired
    against) and which the fallback tuned on."""
    tuned = fallback.get("tuning", {}) if fallback.get("mode") == "auto" else {}
    return {"images": list(ev.names), "sha256": [file_sha256(p) for p in ev.paths],
            "tuning_images": tuned.get("names", []), "tuning_source": tuned.get("source")}


def write_draws(path: Path, draws: dict) -> None:
    """Each figure's bootstrap draws by id (``np.savez``; written whole, then moved into place)."""
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **{k: np.asarray(v, np.float64) for k, v in draws.items()})
    os.replace(tmp, path)


def _tuning(cfg, fallback: dict, ev) -> dict | None:
    """The fallback's tuning images and the figure of the step it kept, checked apart from the gate's images ``ev``."""
    from quantflow.evaluation.floor import untellable_line
    from quantflow.evaluation.metrics import metric
    from quantflow.evaluation.runs import shared_images

    if fallback.get("mode") != "auto":
        return None
    t = fallback["tuning"]
    # a folder of its own (tune_dir, the calibration folder) is checked by content too; a split of data_dir is
    # disjoint by construction (a frame that occurs twice in the user's folder may fall on both sides)
    tuned = [cfg.path(n) for n in t["names"]]
    both = shared_images(tuned, ev.paths, same_bytes=tuning_folder(cfg) is not None)
    if both:
        raise DataError(f"the gate's images and the fallback's tuning images share {len(both)} (e.g. {both[0][1]}); "
                        f"a verdict on them would not be independent")
    last = next(s for s in reversed(fallback["steps"]) if not s.get("undone"))   # the step whose parameters it kept
    return {"source": t["source"], "images": t["images"], "passed": last["passed"],
            "verdict": last.get("verdict", "PASS" if last["passed"] else "FAIL"),
            "figure": metric(fallback.get("metric", cfg.evaluation.metric)).step_line(last),
            **({"steering": last["steering"]} if last.get("steering") else {}),
            **({"untellable": untellable_line(fallback["untellable"])} if fallback.get("untellable") else {})}


EASIER = 3.0   # the steering error on the gate's images over that on the tuning images that the report points out


def easier_tuning(tuned: dict | None, judged: dict | None) -> str | None:
    """A note where INT8's steering error (``evaluation.steering``: the KL divergence, or the worst region's noise
    power) on the gate's images is ``EASIER`` times or more what it was on the tuning images with the same
    parameters: the fallback steered where INT8 looked far better than where it is judged -- typically tuning
    images drawn from the training set (``tune_from = "calibration"`` on a calibration folder of training images),
    on which a network is more certain.  None otherwise, or where either figure is missing."""
    kind = lambda s: str(s.get("figure", "")).split(" (")[0]   # noqa: E731  (not which region is the worst)
    if not tuned or not judged or kind(tuned) != kind(judged):
        return None
    mine, theirs = tuned.get("error"), judged.get("error")
    if mine is None or theirs is None or theirs <= 0 or theirs < EASIER * mine:
        return None
    ratio = f"{theirs / mine:.1f}x" if mine > 0 else "far"
    return (f"INT8's error against FP32 ({tuned['figure']}) is {ratio} larger on the gate's images "
            f"({theirs:.3g}) than on the tuning images ({mine:.3g}): the tuning images look easier than the held-out "
            f"ones (training images?), so the fallback saw less damage than the gate judges; give evaluation.tune_dir "
            f'(held-out images of your own) or evaluation.tune_from = "held_out"')


def _advice(sensitivity: dict, qp, cfg) -> str:
    """The most sensitive layers still in INT8 (ranked by what fails: ``fallback.ranked``) and the settings to try."""
    from quantflow.quantization.sensitivity import figure, focus_label

    int8 = {op.node: op.scope for op in qp.ops}
    worst = [n for n in sensitivity["ranking"] if n in int8][:ADVICE_LAYERS]
    rows = {r["node"]: r for r in sensitivity["ops"]}
    f = sensitivity.get("focus") or {}
    what = focus_label(sensitivity) if f.get("outputs") or f.get("parts") else None
    layers = "; ".join(f"{int8[n]} ({what or 'output'} SQNR {figure(rows[n], f.get('outputs'), f.get('parts')):.1f} "
                       f"dB alone in INT8)" for n in worst)
    tries = []
    if cfg.quantization.fallback == "off":
        tries.append('quantization.fallback = "auto" (rolls the most sensitive layers back to float16)')
    else:
        tries.append(f"a larger quantization.max_fallback (now {cfg.quantization.max_fallback})")
    if isinstance(cfg.quantization.recover, str):
        tries.append('quantization.recover = ["equalize", "ranges", "adaround"] (every recovery method, before any '
                     'fallback)')
    if cfg.calibration.method != "mse":
        tries.append('calibration.method = "mse"')
    tries.append("quantization.skip = [<layer>] for a layer above")
    return f". Most sensitive layers{f' for {what}' if what else ''}: {layers}. Try {'; or '.join(tries)}"


def _key_inputs(b) -> dict:
    c = b.cfg.model_dump(mode="json")
    return {"evaluation": c["evaluation"], **evaluation_inputs(b.cfg), "normalization": c["normalization"],
            "num_classes": b.cfg.model.num_classes, "baseline": _baseline_digest(b.cfg)}


def _baseline_digest(cfg) -> str | None:
    """The baseline's report and draws by content (a new baseline build reruns the gate); None without one, or
    where it cannot be found (the stage then says why)."""
    from quantflow.errors import ConfigError
    if cfg.evaluation.baseline is None:
        return None
    try:
        found = baseline.locate(cfg.path(cfg.evaluation.baseline))
    except ConfigError:
        return None
    draws = found.with_name(REPORT_DRAWS)
    return file_sha256(found) + (file_sha256(draws) if draws.is_file() else "")


def _summary(b) -> dict:
    from quantflow.evaluation.metrics import metric

    d = b.dir("gate")
    report = json.loads((d / REPORT_JSON).read_text())
    m = metric(report)
    verdict = m.verdict(report) + (f"; {report['precision_note']}" if report.get("precision_note") else "")
    return {"gate": {"passed": report["passed"], "metric": m.name, "verdict": verdict,
                     **{k: report[k] for k in m.summary_keys if k in report},
                     **({"figures_verdict": report["verdict"]} if "verdict" in report else {})},
            "accuracy_report": str(d / REPORT_TXT), "report": str(d / REPORT_HTML), "sensitivity": analysis.path(b),
            "junit": str(d / JUNIT_XML), "gate_summary": str(d / SUMMARY_MD)}


STAGE = Stage(
    name="gate", doc="INT8 emulation vs FP32 on held-out images; fails beyond the evaluation limits",
    run=lambda b: gate_stage(b.cfg, b.dir("gate"), b.dir("graph"), b.dir("calibrate"), b.dir("fallback"),
                             b.dir("aipp"), lambda run=False: analysis.ensure(b) if run else analysis.read(b),
                             b.dir("retrain") if b.cfg.retrain else None, b.dir("recover"), parameters_dir(b)),
    needs=("graph", "calibrate", "recover", "retrain", analysis.NAME, "fallback", "aipp"), key_inputs=_key_inputs,
    outputs=GATE_FILES, summary=_summary)
