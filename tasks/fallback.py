"""fallback: the INT8 parameters the build uses: as calibrated, recovered and retrained
(``quantization.fallback = "off"``), or with "auto" those left once the most sensitive ops were rolled back to
float16 until the gate's check on the tuning images gives the verdict the gate would pass
(``evaluation.intervals.settled``: a PASS where ``evaluation.on_undecided = "fail"``, else no FAIL), or
``max_fallback`` ops are in float; each next op the most harmful to what the last check failed (``ranked``: the
region -- output or part -- that loses most).  Every layer is rolled back on trial and kept only if it brings the
steering figure (the metric's low-variance measure of INT8 against FP32, ``evaluation.steering``) at least
``steering.MIN_GAIN`` better (``improves``); otherwise it is put back and the next one tried
(``quantization.fallback.roll_back``): no layer whose roll-back did not help is shipped in float16.  Where the
release prices the distance from the float16 floor (``evaluation.max_vs_float16``), an unhelpful layer stays on
trial with the next instead, until those tried help together (``walks_on``).

The tuning images are never the gate's (``tuning_and_gate_sets``): by default images of ``calibration.data_dir``
beyond the calibration sample, the gate judging every held-out image; ``evaluation.tune_dir`` when given (an image
in it and in ``evaluation.data_dir`` is an error); with ``evaluation.tune_from = "held_out"``
``evaluation.tune_share`` of each class (or group) of ``evaluation.data_dir``, the gate judging the rest."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from quantflow.data.images import IMAGE_EXTS
from quantflow.engine import shard
from quantflow.errors import DataError
from quantflow.io.atomic import write_json
from quantflow.io.digest import file_sha256, folder_digest
from quantflow.quantization.qparams import QPARAMS_JSON, QPARAMS_NPZ, QuantParams
from quantflow.entry import module_file

from . import sensitivity
from .aipp import read_params
from .inputs import evaluation_set, output_names, parameters_dir, read_graph, recovered_check
from .stage import Stage

FALLBACK_JSON = "fallback.json"
GATE_ONLY = ("baseline",)   # [evaluation] settings the fallback does not read
# the fewest tuning images: only below this are images beyond the calibration sample topped up from the sample
# itself, whose ranges were fitted on them (NudeNet's YOLOv8n tuned on its sample read cosine 0.9949 there, 0.9885 on
# the held-out images, and rolled nothing back)
MIN_TUNING_IMAGES = 64


def tuning_and_gate_sets(cfg, calibrated: list | None = None):
    """(the images the recovery's check and the automatic fallback tune on -- None with ``quantization.fallback =
    "off"`` --, the images the gate judges, how the tuning images were chosen).  The two never share an image.

    Tuning steers by INT8 against FP32 and needs none of the gate's power, so by default (``evaluation.tune_from =
    "calibration"``) it runs on images the gate never judges and the gate judges every held-out image:
    ``evaluation.tune_images`` (default: as many as ``evaluation.data_dir`` holds) of ``calibration.data_dir``'s
    images beyond the calibration sample (``calibrated``: its paths; default: the manifest's, where the sample has
    run), only where fewer than ``MIN_TUNING_IMAGES`` are left topped up from the sample itself to that many (the
    ranges were fitted on those, so they come last), any image also in ``evaluation.data_dir`` left out.
    ``evaluation.tune_dir`` (checked against ``evaluation.data_dir``: the same file, or the same bytes, is an
    error) gives a folder of its own;
    ``tune_from = "held_out"`` cuts ``evaluation.data_dir`` in two (``runs.split_held_out``), as the user asks."""
    from quantflow.evaluation.runs import shared_images, split_held_out

    ev, e = evaluation_set(cfg), cfg.evaluation
    if cfg.quantization.fallback != "auto":
        return None, ev, None
    if e.tune_dir is not None:
        tune = _folder_set(cfg, cfg.path(e.tune_dir), ev)
        both = shared_images(tune.paths, ev.paths)
        if both:
            a, b = both[0]
            raise DataError(f"evaluation.tune_dir {e.tune_dir} and evaluation.data_dir {e.data_dir} share "
                            f"{len(both)} image(s) (e.g. {a} and {b}): the gate would judge images the fallback "
                            f"tuned on. Keep them apart, or leave out tune_dir to tune on calibration images")
        return tune, ev, f"evaluation.tune_dir {e.tune_dir}"
    if e.tune_from == "calibration":
        return _calibration_tuning(cfg, ev, calibrated)
    tune, judge = split_held_out(ev, e.tune_share, e.seed)
    if not len(tune) or not len(judge):
        raise DataError(f"evaluation.data_dir {e.data_dir} holds {len(ev)} image(s): too few to tune the automatic "
                        f"fallback on {e.tune_share:.0%} of them and gate on the rest; add images, give "
                        f"evaluation.tune_dir, or leave out tune_from to tune on calibration images")
    return tune, judge, (f"{e.tune_share:.0%} of each folder of evaluation.data_dir {e.data_dir}, drawn with "
                         f"evaluation.seed {e.seed} (evaluation.tune_from = \"held_out\")")


def recovery_tuning_set(cfg):
    """The images the recovery's check tunes on (``recover.py``), or None where it has none: with ``quantization.
    fallback = "auto"`` the fallback's (``tuning_and_gate_sets``); with ``"off"`` ``evaluation.tune_dir`` when
    given, else (``tune_from = "calibration"``) the images of ``calibration.data_dir`` beyond the calibration sample,
    only where at least ``MIN_TUNING_IMAGES`` are there: with no fallback after it, nothing tops them up from the
    sample (whose ranges were fitted on it), and the gate's held-out images are never cut for it."""
    if _auto(cfg):
        return tuning_and_gate_sets(cfg)[0]
    e = cfg.evaluation
    if e.tune_dir is not None:   # the fallback's, with its check that no image is also the gate's
        return tuning_and_gate_sets(cfg.model_copy(update={"quantization": cfg.quantization.model_copy(
            update={"fallback": "auto"})}))[0]
    if e.tune_from != "calibration":
        return None
    tune = _calibration_tuning(cfg, evaluation_set(cfg), None, top_up=False)[0]
    return tune if tune is not None and len(tune) >= MIN_TUNING_IMAGES else None


def recovery_tuning_folder(cfg) -> Path | None:
    """The folder ``recovery_tuning_set`` draws from (known before the sample runs): ``tuning_folder`` with the
    fallback on or off."""
    e = cfg.evaluation
    return e.tune_dir if e.tune_dir is not None else (
        cfg.calibration.data_dir if e.tune_from == "calibration" else None)


def _folder_set(cfg, folder: Path, ev):
    """The images of ``folder`` as a tuning set (labelled like the held-out images; no class need be present)."""
    from quantflow.evaluation.runs import held_out

    return held_out(folder, cfg.labelled_classes, True, cfg.root, shape=ev.shape, normalization=ev.normalization,
                    frame_order=ev.frame_order, batch_size=ev.batch_size, engine=ev.engine)


def _calibration_tuning(cfg, ev, calibrated: list | None, top_up: bool = True):
    """``tuning_and_gate_sets`` for ``evaluation.tune_from = "calibration"``; without ``top_up`` the tuning set
    is None where no image is beyond the sample, and never topped up from it."""
    from dataclasses import replace

    from quantflow.data.sampling import read_manifest
    from quantflow.evaluation.runs import draw, leave_out, shared_images

    from .sample import calibration_paths, manifest_path

    e, k = cfg.evaluation, cfg.calibration
    folder = _folder_set(cfg, cfg.path(k.data_dir), ev)
    if calibrated is None and manifest_path(cfg).is_file():
        calibrated = calibration_paths(cfg)
    skipped = [cfg.path(b["path"]) for b in read_manifest(manifest_path(cfg))["skipped"]] \
        if manifest_path(cfg).is_file() else []
    folder = leave_out(folder, skipped)
    judged = [a for a, _ in shared_images(folder.paths, ev.paths)]
    folder = leave_out(folder, judged)
    wanted = e.tune_images or len(ev)
    beyond = leave_out(folder, calibrated or [])
    tune = draw(beyond, wanted, e.seed)
    extra = 0
    if not top_up and not len(tune):
        return None, ev, None
    if top_up and len(tune) < min(wanted, MIN_TUNING_IMAGES) and calibrated:
        sample = leave_out(folder, beyond.paths)
        top = draw(sample, min(wanted, MIN_TUNING_IMAGES) - len(tune), e.seed)
        extra = len(top)
        order = list(tune.paths) + list(top.paths)
        tune = replace(tune, paths=tuple(order), labels=np.concatenate([tune.labels, top.labels]),
                       names=tuple(tune.names) + tuple(top.names))
    if not len(tune):
        raise DataError(f"calibration.data_dir {k.data_dir} holds no image to tune the automatic fallback on "
                        f"(beside the {len(judged)} also in evaluation.data_dir); give evaluation.tune_dir")
    said = (f"{len(tune) - extra} images of calibration.data_dir {k.data_dir} beyond the calibration sample"
            + (f" and {extra} of the sample itself (the ranges were fitted on those: leave more of the folder out of "
               f"calibration.count)" if extra else "")
            + f", drawn with evaluation.seed {e.seed}" + ("" if calibrated is not None else " (before sampling)")
            + (f"; {len(judged)} also in evaluation.data_dir left out" if judged else ""))
    return tune, ev, said


def focus(sensitivity: dict, m, names: dict | None, report: dict) -> tuple[list[str] | None, list[str] | None]:
    """What a failed ``report`` points at, as ``(outputs, parts)`` for ``sensitivity.rank`` and ``figure``: the
    failing parts (``per_part``, where the per-layer analysis measured them), with any failing whole outputs it
    measured apart.  Else (a failing task number, top-1 drop or whole output) the outputs ``m.focus`` names (none
    named: every output the report measures), each at the finest the gate compares it (``evaluation.parts.finest``:
    its parts where the analysis measured them, else the output whole), so that a layer is ranked by the region it
    harms most, not by the whole output, whose energy one part can dominate (a detector's boxes in pixels beside
    its scores in 0..1).  Outputs are named as the graph IR does (``names``: IR name -> the model file's);
    (None, None) for one output not cut into parts: the pooled figure."""
    ops = sensitivity["ops"]
    ir_name = {shown: ir for ir, shown in (names or {}).items()}

    def measured(key: str, name: str) -> bool:
        return all(name in r.get(key, {}) for r in ops)

    failing, rows = set(report.get("failures", [])), report.get("outputs", [])
    parts = [r["part"] for r in rows if r.get("part") in failing]
    if parts and all(measured("per_part", p) for p in parts):
        whole = [ir_name.get(r["output"], r["output"]) for r in rows if not r.get("part") and r["output"] in failing]
        return [o for o in whole if measured("per_output", o)], parts
    outputs = m.focus(report) or list(dict.fromkeys(r["output"] for r in rows)) or None
    if outputs is None:
        return None, None
    parts = [r["part"] for r in rows if r.get("part") and r["output"] in outputs and measured("per_part", r["part"])]
    split = {r["output"] for r in rows if r.get("part") in parts}
    whole = [ir_name.get(o, o) for o in outputs if o not in split]
    several = all("per_output" in r for r in ops)   # one network output: its figure is the pooled one
    whole = [o for o in whole if measured("per_output", o)] if several else whole
    if not parts and not several:
        return None, None
    return whole, parts or None


def ranked(sensitivity: dict, m, names: dict | None, report: dict) -> dict:
    """The per-layer analysis ranked by what ``report`` fails on (``focus``): ``ranking`` most harmful first, and
    ``focus`` what it ranks by (empty lists: the outputs pooled).  The one ranking the failure message, the
    report's sensitivity table and chart, and the fallback's order all take."""
    from quantflow.quantization.sensitivity import rank

    outputs, parts = focus(sensitivity, m, names, report)
    return {**sensitivity, "ranking": rank(sensitivity["ops"], outputs, parts),
            "focus": {"outputs": outputs or [], "parts": parts or []}}


def focus_ranking(sensitivity: dict, m, names: dict | None, macs: dict[str, int] | None = None):
    """``rerank(report)`` for ``roll_back``: the layers most harmful to what a failed check points at
    (``ranked``); for a check with no FAIL, what is UNDECIDED in it.  Where the distance from the float16 floor
    (``evaluation.max_vs_float16``) is among what fails and ``macs`` (multiply-adds by node) is given, the same
    ranking's harm per multiply-add (``per_mac``): a release pays for each step in device speed."""
    from quantflow.evaluation.floor import VS_FLOAT16

    def short(report: dict) -> dict:
        return report if report.get("failures") else dict(report, failures=report.get("undecided", []))

    def rerank(report: dict) -> list[str]:
        r = ranked(sensitivity, m, names, short(report))
        failing = short(report)["failures"]
        if macs and VS_FLOAT16 in failing:
            return per_mac(r, macs)
        return r["ranking"]
    return rerank


def per_mac(analysis: dict, macs: dict[str, int]) -> list[str]:
    """The ranked analysis's layers by the output noise each adds alone in INT8 (``sensitivity.figure`` of what it
    ranks by, as noise power 10^(-SQNR/10)) per multiply-add, most first; ties by the ranking's order."""
    from quantflow.quantization.sensitivity import figure

    f = analysis.get("focus") or {}
    rows = {r["node"]: r for r in analysis["ops"]}
    order = {n: i for i, n in enumerate(analysis["ranking"])}

    def cost(node: str) -> float:
        db = figure(rows[node], f.get("outputs") or None, f.get("parts") or None)
        return (10 ** (-db / 10) if np.isfinite(db) else 0.0) / max(macs.get(node, 1), 1)
    return sorted(analysis["ranking"], key=lambda n: (-cost(n), order[n]))


def walks_on(cfg) -> bool:
    """Whether the roll-back keeps an unhelpful layer on trial with the next (``roll_back``'s ``grow``) instead of
    putting it back: where the release prices the distance from the float16 floor (``evaluation.max_vs_float16``).
    It has said how many layers it will pay (``max_fallback``), and where a few images carry the noise (a softmax
    near its decision) no single layer more in float16 may read better while several together do.  One at a time,
    with ``max_vs_float16 = 2``, PP-OCR's direction classifier tried each of its 37 INT8 layers and kept two, at 11x
    float16's noise on the tuning images; PP-LCNet's orientation classifier stopped after three misses in a row at
    58x, with 22 of its layers never tried."""
    return cfg.evaluation.max_vs_float16 is not None


def fallback_stage(cfg, kdir: Path, params_dir: Path, graph_dir: Path, aipp_dir: Path | None,
                   sensitivity: dict | None, first: dict | None = None) -> dict:
    """``first``: the check on the tuning images of the parameters in ``params_dir``, where one was made (the
    recovery's): the roll-back's step 0 takes it."""
    from quantflow.evaluation import floor
    from quantflow.evaluation.metrics import metric
    from quantflow.evaluation.steering import line as steering_line
    from quantflow.quantization.fallback import roll_back
    from quantflow.quantization.macs import macs_by_node
    from quantflow.quantization.passes import fold_for_quantization

    kdir, q = Path(kdir), cfg.quantization
    qp = QuantParams.load(params_dir)  # as calibrated, or retrained
    if q.fallback == "off":
        result = {"mode": "off", "steps": [], "float_ops": []}
    else:
        tune, judge, source = tuning_and_gate_sets(cfg)
        print(f"fallback: accuracy checks on {len(tune)} tuning images ({source}; the gate judges {len(judge)} "
              f"held-out images, none of them) {shard.where(cfg.engine)}")
        graph = read_graph(cfg, graph_dir)
        m = metric(cfg.evaluation.metric)
        names = output_names(cfg, graph)
        folded = fold_for_quantization(graph)
        check = floor.checker(m, tune, cfg.evaluation, graph, folded, read_params(aipp_dir), names)
        on_undecided = cfg.evaluation.on_undecided
        qp, steps = roll_back(qp, sensitivity["ranking"], check, q.max_fallback, m.step_keys,
                              rerank=focus_ranking(sensitivity, m, names, macs_by_node(folded)),
                              settled=lambda report, looks: tuning_settled(report, on_undecided, len(judge), looks),
                              improves=improves, first=first, looks=first.get("looks", 1) if first else 0,
                              grow=walks_on(cfg))
        for st in steps:   # the roll-back records each check's distance; which of them could not show the limit
            u = floor.untellable(st.get("distance"), cfg.evaluation.max_vs_float16, cfg.evaluation.confidence)
            if u:
                st["untellable"] = u
        final = next(st for st in reversed(steps) if not st.get("undone"))
        result = {"mode": "auto", "metric": m.name, "max_fallback": q.max_fallback, "steps": steps,
                  "float_ops": final["float_ops"], "passed": final["passed"],
                  "tuning": {"source": source, "images": len(tune), "names": list(tune.names)}}
        if final.get("untellable"):
            result["untellable"] = final["untellable"]
        for i, st in enumerate(steps):
            names = ", ".join(f["scope"] for f in st["float_ops"]) or "none"
            steer = f", {steering_line(st['steering'])}" if st.get("steering") else ""
            verdict = st.get("verdict", "PASS" if st["passed"] else "FAIL")
            if verdict == "PASS" and not st["passed"]:
                verdict += (" (not settled: too few outcomes change on these images to show the limit)"
                            if st.get("untellable") else
                            " (not settled: its worst case, or the gate's own interval on its images"
                            + (f" with the margin of its check {st['looks']} of these images" if st.get("looks", 1) > 1
                               else "") + ", misses the limit)")
            d = st.get("distance")
            steer += (f", {d['int8_changed']:g} {d['unit']} changed ({d['ratio']:.3g}x float16's), INT8 "
                      f"{d['int8_mac_share']:.1%} of the multiply-adds" if d and "int8_mac_share" in d else "")
            print(f"fallback step {i}: {st['int8_ops']} INT8 ops, {m.step_line(st)}{steer} {verdict}; "
                  f"in float16: {names}"
                  + ("; did not help yet: its last layer stays on trial with the next" if st.get("grows") else
                     "; did not help: its last layer is put back" if st.get("undone") else ""))
    qp.save(kdir)
    write_json(kdir / FALLBACK_JSON, result)
    return result


def tuning_settled(report: dict, on_undecided: str, gate_images: int | None = None, looks: int = 1) -> bool:
    """The roll-back's (and the recovery's) stopping rule on a check of the tuning images: the verdict the gate
    would pass there (``intervals.settled``); where the metric's steering figure has one, its worst case within the
    gate's limit (``steering.worst_case_settled``: top-1's flip rate); and, where the gate asks for a decided PASS
    (``evaluation.on_undecided = "fail"``) and judges ``gate_images``, the PASS it can expect there
    (``intervals.expected_pass``): a figure just inside its limit on the tuning images is UNDECIDED on the gate's.
    ``looks``: the checks of these tuning images made so far, this one among them (the margin grows with them).
    Where a release set ``evaluation.max_vs_float16``, never while the images count too few outcomes to show it
    (``floor.untellable``): the walk goes on, to ``max_fallback`` or the float16-only path."""
    from quantflow.evaluation.floor import report_untellable
    from quantflow.evaluation.intervals import expected_pass, settled
    from quantflow.evaluation.steering import worst_case_settled

    expected = (on_undecided != "fail" or not gate_images or "figures" not in report
                or expected_pass(report["figures"], report.get("images", 0), gate_images, looks))
    return (settled(report["verdict"], on_undecided) and worst_case_settled(report, on_undecided) and expected
            and report_untellable(report) is None)


def improves(report: dict, before: dict) -> bool:
    """Whether a check with one more layer in float16 is better than the last kept one: the task outcomes it changes
    against FP32 fewer beyond their paired noise (``floor.fewer_changes``: a roll-back that turns decisions back,
    whatever it does to the outputs' SQNR); else its steering figure (the
    metric's low-variance measure of INT8 against FP32, ``evaluation.steering``, on the regions the last kept check
    fails on, else on what is UNDECIDED in it) lower in error by ``steering.MIN_GAIN``; for checks without one, its
    gated figures nearer their limits (``intervals.shortfall``)."""
    from quantflow.evaluation.floor import fewer_changes
    from quantflow.evaluation.intervals import shortfall
    from quantflow.evaluation.steering import helps

    if fewer_changes(report, before):
        return True
    if report.get("steering") and before.get("steering"):
        return helps(report["steering"], before["steering"], before.get("failures") or before.get("undecided"))
    if "figures" not in report or "figures" not in before:
        return True
    return shortfall(report["figures"]) < shortfall(before["figures"])


def _auto(cfg) -> bool:
    return cfg.quantization.fallback == "auto"


def _run(b) -> None:
    c = b.cfg
    result = fallback_stage(c, b.dir("fallback"), parameters_dir(b), b.dir("graph"),
                            b.dir("aipp") if _auto(c) else None, sensitivity.ensure(b) if _auto(c) else None,
                            recovered_check(b) if _auto(c) else None)
    if result["mode"] == "off":
        print("quantization.fallback = off: every calibrated op stays INT8")
    else:
        names = ", ".join(f["scope"] for f in result["float_ops"]) or "none"
        status = ("passes the accuracy check on the tuning images" if result["passed"] else
                  "the tuning images cannot show evaluation.max_vs_float16" if result.get("untellable") else
                  "still fails the accuracy check on the tuning images")
        print(f"fallback: {len(result['float_ops'])} op(s) rolled back to float16 ({names}); {status}")
        if result.get("untellable"):
            from quantflow.evaluation.floor import untellable_line
            print(f"fallback: {untellable_line(result['untellable'])}")


def evaluation_inputs(cfg) -> dict:
    """What the evaluation depends on beyond ``[evaluation]`` itself: the held-out images (and the folder of the
    tuning images, ``tuning_folder``), YOLO label files beside them, files its options name, and the source of a task
    metric of the user's."""
    e = cfg.evaluation
    source = _metric_file(cfg)
    tune = tuning_folder(cfg)
    return {"eval_data": folder_digest(cfg.path(e.data_dir), IMAGE_EXTS),
            "tune_data": folder_digest(cfg.path(tune), IMAGE_EXTS) if tune else None,
            "labels": _labels_digest(cfg) if e.metric == "detection" else None,
            "option_files": _option_files(cfg),
            "metric_source": file_sha256(source) if source else None}


def tuning_folder(cfg) -> Path | None:
    """The folder the tuning images are drawn from, where it is not ``evaluation.data_dir``: ``evaluation.tune_dir``,
    or ``calibration.data_dir`` (``evaluation.tune_from = "calibration"``, with ``quantization.fallback = "auto"``)."""
    e = cfg.evaluation
    if e.tune_dir is not None:
        return e.tune_dir
    return cfg.calibration.data_dir if e.tune_from == "calibration" and _auto(cfg) else None


def _option_files(cfg) -> dict:
    """The files ``evaluation.options`` names (e.g. the ctc metric's labels and charset), by content: editing one
    reruns the evaluation."""
    return {k: file_sha256(cfg.path(v)) for k, v in sorted(cfg.evaluation.options.items())
            if isinstance(v, str) and v and cfg.path(v).is_file()}


def _metric_file(cfg) -> Path | None:
    """The source file of a task metric of the user's: a module beside the config (looked up there first, so that
    every process computes the same key whatever its sys.path), or an installed one."""
    e = cfg.evaluation
    if not e.task or ":" not in e.metric:
        return None
    module = Path(*e.metric.partition(":")[0].split("."))
    for candidate in (cfg.root / module.with_suffix(".py"), cfg.root / module / "__init__.py"):
        if candidate.is_file():
            return candidate
    found = module_file(e.metric)
    return Path(found[0]) if found else None


def _labels_digest(cfg) -> str | None:
    """The YOLO label files of the held-out images (and of the tuning images), by image and content."""
    from quantflow.data.images import scan_images
    from quantflow.evaluation.detection import label_file

    h, e = hashlib.sha256(), cfg.evaluation
    for folder in filter(None, (e.data_dir, tuning_folder(cfg))):
        try:
            items = scan_images(cfg.path(folder), cfg.labelled_classes)
        except DataError:
            continue   # the stage itself reports the folder
        for it in items:
            found = label_file(it.path)
            if found is not None:
                h.update(f"{os.path.relpath(it.path, cfg.root)}\0{file_sha256(found)}\n".encode())
    return h.hexdigest()


def _key_inputs(b) -> dict:
    cfg = b.cfg
    if not _auto(cfg):
        return {"fallback": "off"}
    c = cfg.model_dump(mode="json")
    # what only the gate reads (the baseline) does not rerun the fallback
    evaluation = {k: v for k, v in c["evaluation"].items() if k not in GATE_ONLY}
    return {"fallback": "auto", "max_fallback": cfg.quantization.max_fallback, "evaluation": evaluation,
            **evaluation_inputs(cfg), "normalization": c["normalization"], "num_classes": cfg.model.num_classes}


def _summary(b) -> dict:
    result = json.loads((b.dir("fallback") / FALLBACK_JSON).read_text())
    return {"qparams": str(b.dir("fallback") / QPARAMS_JSON), "float16_fallback": [f["scope"] for f in result["float_ops"]]}


STAGE = Stage(
    name="fallback", doc='the INT8 parameters used: as calibrated, or (fallback = "auto") the most sensitive ops in '
                         'float16, tuned on images the gate does not judge',
    run=_run, needs=lambda cfg: ("graph", "calibrate", "recover", "retrain") + (
        ("aipp", sensitivity.NAME) if _auto(cfg) else ()),
    key_inputs=_key_inputs,
    outputs=(QPARAMS_JSON, QPARAMS_NPZ, FALLBACK_JSON), summary=_summary)
