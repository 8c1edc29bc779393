"""fallback: the INT8 parameters the build uses: as calibrated, recovered and retrained
(``quantization.fallback = "off"``), or with "auto" those left once the most sensitive ops were rolled back to
float16 until the gate's check on the tuning images gives the verdict the gate would pass
(``evaluation.intervals.settled``: a PASS where ``evaluation.on_undecided = "fail"``, else no FAIL), or
``max_fallback`` ops are in float; each next op the most sensitive on what the last check failed (the outputs
gate: the outputs below the limit).  Past an UNDECIDED check a layer is rolled back on trial and kept only if it
brings the figures closer to their limits (``intervals.shortfall``); otherwise it is put back and the fallback
stops (``quantization.fallback.roll_back``): the tuning images cannot decide more.

The tuning images are never the gate's: ``evaluation.tune_dir`` when given (an image in it and in
``evaluation.data_dir`` is an error), else ``evaluation.tune_share`` of each class (or group) of
``evaluation.data_dir``, the gate judging the rest (``tuning_and_gate_sets``)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from quantflow.data.images import IMAGE_EXTS
from quantflow.engine import shard
from quantflow.errors import DataError
from quantflow.io.atomic import write_json
from quantflow.io.digest import file_sha256, folder_digest
from quantflow.quantization.qparams import QPARAMS_JSON, QPARAMS_NPZ, QuantParams

from . import sensitivity
from .aipp import read_params
from .inputs import evaluation_set, output_names, parameters_dir, read_graph, recovered_check
from .preflight import module_file
from .stage import Stage

FALLBACK_JSON = "fallback.json"
GATE_ONLY = ("baseline",)   # [evaluation] settings the fallback does not read


def tuning_and_gate_sets(cfg):
    """(the images the automatic fallback tunes on -- None with ``quantization.fallback = "off"`` --, the images
    the gate judges, where the tuning images come from).  The two never share an image: ``evaluation.tune_dir``
    is checked against ``evaluation.data_dir`` (the same file, or the same bytes, is an error), and without it
    ``runs.split_held_out`` cuts ``evaluation.data_dir`` in two."""
    from quantflow.evaluation.runs import held_out, shared_images, split_held_out

    ev, e = evaluation_set(cfg), cfg.evaluation
    if cfg.quantization.fallback != "auto":
        return None, ev, None
    if e.tune_dir is not None:
        tune = held_out(cfg.path(e.tune_dir), cfg.labelled_classes, True, cfg.root, shape=ev.shape,
                        normalization=ev.normalization, frame_order=ev.frame_order, batch_size=ev.batch_size,
                        engine=ev.engine)
        both = shared_images(tune.paths, ev.paths)
        if both:
            a, b = both[0]
            raise DataError(f"evaluation.tune_dir {e.tune_dir} and evaluation.data_dir {e.data_dir} share "
                            f"{len(both)} image(s) (e.g. {a} and {b}): the gate would judge images the fallback "
                            f"tuned on. Keep them apart, or leave out tune_dir to tune on a part of data_dir")
        return tune, ev, f"evaluation.tune_dir {e.tune_dir}"
    tune, judge = split_held_out(ev, e.tune_share, e.seed)
    if not len(tune) or not len(judge):
        raise DataError(f"evaluation.data_dir {e.data_dir} holds {len(ev)} image(s): too few to tune the automatic "
                        f"fallback on {e.tune_share:.0%} of them and gate on the rest; add images or give "
                        f"evaluation.tune_dir")
    return tune, judge, (f"{e.tune_share:.0%} of each folder of evaluation.data_dir {e.data_dir}, drawn with "
                         f"evaluation.seed {e.seed}")


def focus(sensitivity: dict, m, names: dict | None, report: dict) -> tuple[list[str] | None, list[str] | None]:
    """What a failed ``report`` points at, as ``(outputs, parts)`` for ``sensitivity.rank`` and ``figure``: the
    failing parts (``per_part``, where the per-layer analysis measured them), with any failing whole outputs it
    measured apart; else the outputs ``m.focus`` names (a failing part: its output), by the per-output figures,
    which name the outputs as the graph IR does (``names``: IR name -> the model file's); (None, None) for the
    outputs pooled."""
    ops = sensitivity["ops"]
    ir_name = {shown: ir for ir, shown in (names or {}).items()}

    def measured(key: str, name: str) -> bool:
        return all(name in r.get(key, {}) for r in ops)

    failing, rows = set(report.get("failures", [])), report.get("outputs", [])
    parts = [r["part"] for r in rows if r.get("part") in failing]
    if parts and all(measured("per_part", p) for p in parts):
        whole = [ir_name.get(r["output"], r["output"]) for r in rows if not r.get("part") and r["output"] in failing]
        return [o for o in whole if measured("per_output", o)], parts
    outputs = m.focus(report)
    return ([ir_name.get(o, o) for o in outputs] if outputs else None), None


def focus_ranking(sensitivity: dict, m, names: dict | None):
    """``rerank(report)`` for ``roll_back``: the layers most harmful to what a failed check points at
    (``focus``); for a check with no FAIL, what is UNDECIDED in it."""
    from quantflow.quantization.sensitivity import rank

    def short(report: dict) -> dict:
        return report if report.get("failures") else dict(report, failures=report.get("undecided", []))
    return lambda report: rank(sensitivity["ops"], *focus(sensitivity, m, names, short(report)))


def fallback_stage(cfg, kdir: Path, params_dir: Path, graph_dir: Path, aipp_dir: Path | None,
                   sensitivity: dict | None, first: dict | None = None) -> dict:
    """``first``: the check on the tuning images of the parameters in ``params_dir``, where one was made (the
    recovery's): the roll-back's step 0 takes it."""
    from quantflow.evaluation.intervals import FAIL, settled, shortfall
    from quantflow.evaluation.metrics import metric
    from quantflow.quantization.fallback import roll_back
    from quantflow.quantization.passes import fold_for_quantization

    kdir, q = Path(kdir), cfg.quantization
    qp = QuantParams.load(params_dir)  # as calibrated, or retrained
    if q.fallback == "off":
        result = {"mode": "off", "steps": [], "float_ops": []}
    else:
        tune, judge, source = tuning_and_gate_sets(cfg)
        print(f"fallback: accuracy checks on {len(tune)} tuning images ({source}; the gate judges {len(judge)} "
              f"others) {shard.where(cfg.engine)}")
        graph = read_graph(cfg, graph_dir)
        m = metric(cfg.evaluation.metric)
        names = output_names(cfg, graph)
        check = m.checker(tune, cfg.evaluation, graph, fold_for_quantization(graph), read_params(aipp_dir), names)
        on_undecided = cfg.evaluation.on_undecided
        qp, steps = roll_back(qp, sensitivity["ranking"], check, q.max_fallback, m.step_keys,
                              rerank=focus_ranking(sensitivity, m, names),
                              settled=lambda report: settled(report["verdict"], on_undecided),
                              closer=lambda report, before: None if before["verdict"] == FAIL or "figures" not in report
                              else shortfall(report["figures"]) < shortfall(before["figures"]),
                              first=first)
        final = next(st for st in reversed(steps) if not st.get("undone"))
        result = {"mode": "auto", "metric": m.name, "max_fallback": q.max_fallback, "steps": steps,
                  "float_ops": final["float_ops"], "passed": final["passed"],
                  "tuning": {"source": source, "images": len(tune), "names": list(tune.names)}}
        for i, st in enumerate(steps):
            names = ", ".join(f["scope"] for f in st["float_ops"]) or "none"
            print(f"fallback step {i}: {st['int8_ops']} INT8 ops, {m.step_line(st)} "
                  f"{st.get('verdict', 'PASS' if st['passed'] else 'FAIL')}; in float16: {names}"
                  + ("; no closer to passing: its last layer is put back" if st.get("undone") else ""))
    qp.save(kdir)
    write_json(kdir / FALLBACK_JSON, result)
    return result


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
        print(f"fallback: {len(result['float_ops'])} op(s) rolled back to float16 ({names}); "
              f"{'passes' if result['passed'] else 'still fails'} the accuracy check on the tuning images")


def evaluation_inputs(cfg) -> dict:
    """What the evaluation depends on beyond ``[evaluation]`` itself: the held-out images (and the tuning images
    of ``evaluation.tune_dir``), YOLO label files beside them, files its options name, and the source of a task
    metric of the user's."""
    e = cfg.evaluation
    source = _metric_file(cfg)
    return {"eval_data": folder_digest(cfg.path(e.data_dir), IMAGE_EXTS),
            "tune_data": folder_digest(cfg.path(e.tune_dir), IMAGE_EXTS) if e.tune_dir else None,
            "labels": _labels_digest(cfg) if e.metric == "detection" else None,
            "option_files": _option_files(cfg),
            "metric_source": file_sha256(source) if source else None}


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
    for folder in filter(None, (e.data_dir, e.tune_dir)):
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
