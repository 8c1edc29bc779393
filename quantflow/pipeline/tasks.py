r"""The quantflow doit task graph, shipped with the package: a model repo needs only its quantflow.toml,
and ``quantflow build`` (quantflow.cli, through ``namespace(config)``) or a three-line dodo.py runs it::

    from quantflow.pipeline.tasks import *  # noqa: F401,F403  (the task_* functions)
    from quantflow.pipeline.tasks import doit_config
    DOIT_CONFIG = doit_config()   # `doit config=FILE` (default quantflow.toml) chooses the configuration

    train (optional) -> sample -> graph -> calibrate -> fallback -> export -> atc --\
                          \                               |   \                /     >-> summary
                           \--> aipp ------------------(auto)--\--> gate ------------/
                                  \-------------------------------------> atc

``train`` and ``sample`` are tracked by doit (file dependencies and config sections).  Every
later stage writes into ``<output_dir>/artifacts/<stage>/<key>/`` where the key hashes that
stage's own inputs and the keys of the stages it reads from (quantflow.pipeline.cache); those
tasks are created once ``sample`` has run, and are up to date exactly when their outputs and
completion marker exist under their current key.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from pathlib import Path

from doit import create_after, get_var
from doit.exceptions import TaskFailed
from doit.tools import config_changed

from quantflow.images import file_sha256
from quantflow.pipeline import atomic, cache, lock
from quantflow.pipeline.metrics import metric
from quantflow.config import DEFAULT_CONFIG_NAME, load_config
from quantflow.errors import QuantflowError

# ----------------------------------------------------------------------------- the build

# The one build this process runs: its configuration ("cfg", loaded once), the stage keys ("keys") and what they
# hash ("key_inputs").  It is bound either explicitly (namespace(), which quantflow build calls) or, for a dodo.py,
# on first use from doit's command line; nothing about it is fixed at import.
_state: dict = {}


DEFAULT_TASKS = ["preflight", "train", "sample", "graph", "calibrate", "aipp", "fallback", "export", "atc", "gate",
                 "summary"]
__all__ = [f"task_{t}" for t in DEFAULT_TASKS]


def config_file() -> Path:
    """``doit config=FILE``, else $QUANTFLOW_CONFIG, else quantflow.toml in the current directory."""
    # get_var gives None outside a doit command line
    return Path(get_var("config", None) or os.environ.get("QUANTFLOW_CONFIG") or DEFAULT_CONFIG_NAME)


def open_build(path: Path):
    """Load the configuration at ``path`` for building: take its output folder's lock (one build at a time per
    build.output_dir; a second build of the same folder waits), sweep what a killed build left there, and let
    model.entry / train.entry modules beside the config import.  A bad config raises QuantflowError."""
    c = load_config(path)
    lock.acquire(c.out)
    atomic.sweep(c.out)
    if str(c.root) not in sys.path:
        sys.path.insert(0, str(c.root))
    return c


def namespace(config: Path | str) -> dict:
    """The task graph for one configuration file, as doit's ModuleTaskLoader takes it: the task_* creators and
    DOIT_CONFIG.  Binds this process's build to ``config`` (opened with open_build)."""
    _state.clear()
    _state["cfg"] = open_build(Path(config))
    return {**{name: globals()[name] for name in __all__}, "DOIT_CONFIG": doit_config()}


def cfg():
    """The bound build's configuration; a dodo.py's build is bound here, on first use, to config_file()."""
    if "cfg" not in _state:
        try:
            _state["cfg"] = open_build(config_file())
        except QuantflowError as err:  # a clean message instead of doit's traceback of the loader
            print(f"quantflow: {err}", file=sys.stderr)
            raise SystemExit(2) from None
    return _state["cfg"]


def doit_config() -> dict:
    """doit's settings for the bound build: its state (sqlite, which commits atomically: a build killed while
    doit records its state cannot corrupt it) beside the build's own outputs, so that builds with different
    output folders never share it."""
    return {"default_tasks": DEFAULT_TASKS, "verbosity": 2, "dep_file": str(cfg().out / ".doit.sqlite"),
            "backend": "sqlite3"}


def manifest_path(c=None) -> Path:
    """The calibration manifest of configuration ``c`` (default: the bound build's)."""
    return (c if c is not None else cfg()).out / "calibration" / "manifest.json"


def latest_path(c=None) -> Path:
    """``<output_dir>/latest.json``, naming the artifacts of the last build that passed the gate."""
    return (c if c is not None else cfg()).out / "latest.json"


def _key(c, stage: str, memo: dict) -> tuple[str, dict]:
    """``stage``'s artifact key under configuration ``c`` and the inputs it hashes (memoized in ``memo``)."""
    if stage not in memo:
        upstream = {u: _key(c, u, memo)[0] for u in cache.upstream(c, stage)}
        inputs = cache.stage_inputs(c, stage, manifest_path(c), upstream)
        memo[stage] = (cache.artifact_key(inputs), inputs)
    return memo[stage]


def stage_key(stage: str) -> tuple[str, Path]:
    """A keyed stage's artifact key and folder (computed once the checkpoint and the manifest exist); the folder
    is created with the key's inputs in it (key_inputs.json)."""
    keys = _state.setdefault("keys", {})
    if stage not in keys:
        key, inputs = _key(cfg(), stage, _state.setdefault("key_inputs", {}))
        kdir = cache.artifact_dir(cfg(), stage, key)
        kdir.mkdir(parents=True, exist_ok=True)
        atomic.write_json(kdir / "key_inputs.json", inputs)
        keys[stage] = (key, kdir)
    return keys[stage]


def stage_dir(stage: str) -> Path:
    return stage_key(stage)[1]


def artifact_status(c) -> dict[str, tuple[bool, Path]]:
    """For each keyed stage: whether its artifacts for the current inputs are complete, and their folder.  Reads
    only (no lock, nothing written), so it may run beside a build; empty before the first ``sample``, whose
    manifest every key depends on.  The keys follow the manifest as last sampled."""
    if not manifest_path(c).is_file():
        return {}
    memo: dict = {}
    status = {}
    for stage in cache.UPSTREAM:
        kdir = cache.artifact_dir(c, stage, _key(c, stage, memo)[0])
        status[stage] = (cache.done_marker(kdir, stage).is_file(), kdir)
    return status


def guarded(fn):
    """A doit python-action that reports QuantflowError as a clean task failure."""
    @functools.wraps(fn)
    def action(*args, **kwargs):
        try:
            fn(*args, **kwargs)
        except QuantflowError as err:
            return TaskFailed(f"{type(err).__name__}: {err}")
        return None
    return action


def _write_json(path: Path, data) -> None:
    atomic.write_json(path, data)


def _calibration_paths():
    from quantflow.sampling import manifest_paths, read_manifest
    return manifest_paths(read_manifest(manifest_path()), cfg().root)


def _module_file(entry: str) -> list[str]:
    spec = importlib.util.find_spec(entry.partition(":")[0])
    return [spec.origin] if spec is not None and spec.origin and os.path.isfile(spec.origin) else []


# ----------------------------------------------------------------------------- actions

@guarded
def do_preflight():
    from quantflow.pipeline.preflight import preflight

    r = preflight(cfg())
    outs = r["network_outputs"]
    print(f"preflight: network output{'s' if len(outs) > 1 else ''} {', '.join(map(str, outs))}, images readable "
          f"({', '.join(f'{k}: {v} checked' for k, v in r['images_checked'].items())}), AIPP reproduces the "
          f"training preprocessing on {r['aipp_images']} images (largest |diff| {r['aipp_max_abs_diff']:.2e})")


@guarded
def do_train():
    from quantflow.model import load_entry

    c = cfg()
    ckpt = c.path(c.model.checkpoint)
    print(f"training {c.model.entry} with {c.train.entry} -> {ckpt}")
    load_entry(c.train.entry, "train.entry")(c, ckpt)
    if not ckpt.is_file():
        raise QuantflowError(f"train.entry {c.train.entry} returned without writing model.checkpoint {ckpt}")
    # the completion record, written last: what was trained from what (doit's own record of a run is saved
    # only when the run ends, so a build killed later in the same run would otherwise retrain)
    atomic.write_json(_train_record(), {"inputs": _train_inputs(), "checkpoint_sha256": file_sha256(ckpt)})


def _train_record() -> Path:
    return cfg().out / "train.json"


def _train_inputs() -> dict:
    c = cfg()
    return {"train": c.train.model_dump(mode="json"),
            "model": c.model.model_dump(mode="json", exclude={"input_name", "verify_images", "verify_tolerance"}),
            "sources": {e: [file_sha256(Path(f)) for f in _module_file(e)] for e in (c.train.entry, c.model.entry)}}


def _train_uptodate() -> bool:
    """Trained already: the record matches the current inputs and the checkpoint it names is there, unchanged."""
    ckpt = cfg().path(cfg().model.checkpoint)
    try:
        record = json.loads(_train_record().read_text())
    except (OSError, ValueError):
        return False
    return (record.get("inputs") == json.loads(json.dumps(_train_inputs())) and ckpt.is_file()
            and record.get("checkpoint_sha256") == file_sha256(ckpt))


@guarded
def do_sample():
    from quantflow.sampling import sample, write_manifest

    c = cfg()
    _, ch, h, w = c.model.input_shape
    k = c.calibration
    m = sample(c.path(k.data_dir), c.root, k.count, k.per_class_min, k.seed, c.labelled_classes, ch, h, w,
               k.on_bad_image)
    write_manifest(m, manifest_path())
    per_class = ", ".join(f"{cl}:{v['selected']}/{v['available']}" for cl, v in m["classes"].items())
    kind = "class" if c.labelled_classes else "folder"
    print(f"sampled {len(m['images'])} calibration images ({kind}:selected/available {per_class}) -> {manifest_path()}")
    for s in m["skipped"]:
        print(f"WARNING skipped unusable calibration image: {s['reason']}", file=sys.stderr)


@guarded
def do_graph():
    from quantflow.pipeline.stages import graph_stage

    kdir = stage_dir("graph")
    info = graph_stage(cfg(), kdir, _calibration_paths())
    v = info["verify"]
    ops = ", ".join(f"{k} {n}" for k, n in info["ops"].items())
    print(f"graph IR of {info['model_file']} ({info['source']}): {info['nodes']} nodes ({ops})")
    print(f"IR float output matches {v['reference']} on {v['images']} calibration images: largest |diff| "
          f"{v['max_abs_diff']:.2e} (relative {v['relative_diff']:.2e}, tolerance {v['tolerance']:g})")
    if info["float16_assumed_ops"]:
        print(f"note: the INT8 emulation models {', '.join(info['float16_assumed_ops'])} as float32 math rounded to "
              f"float16; the device's own float16 kernels may differ in the last bit")
    cache.mark_done(kdir, "graph")


@guarded
def do_calibrate():
    from quantflow.pipeline.stages import calibrate_stage

    kdir = stage_dir("calibrate")
    qp, images, table = calibrate_stage(cfg(), kdir, _calibration_paths(), stage_dir("graph"))
    print(f"calibrated {len(qp.ops)} INT8 ops with {qp.method} on {images} images -> {kdir / 'qparams.json'}\n{table}")
    cache.mark_done(kdir, "calibrate")


@guarded
def do_fallback():
    from quantflow.pipeline.stages import fallback_stage

    c = cfg()
    kdir = stage_dir("fallback")
    result = fallback_stage(c, kdir, stage_dir("calibrate"), stage_dir("graph"),
                            stage_dir("aipp") if c.quantization.fallback == "auto" else None)
    if result["mode"] == "off":
        print("quantization.fallback = off: every calibrated op stays INT8")
    else:
        names = ", ".join(f["scope"] for f in result["float_ops"]) or "none"
        print(f"fallback: {len(result['float_ops'])} op(s) rolled back to float16 ({names}); "
              f"{'passes' if result['passed'] else 'still fails'} the accuracy check")
    cache.mark_done(kdir, "fallback")


@guarded
def do_export():
    from quantflow.pipeline.stages import export_stage

    kdir = stage_dir("export")
    st = export_stage(cfg(), kdir, stage_dir("graph"), stage_dir("fallback"))
    print(f"exported INT8 deploy graph ({st['int8_ops']} AscendQuant/AscendDequant pairs) -> {kdir / st['deploy_onnx']}, "
          f"{kdir / st['deploy_mindir']} (network source {st['deploy_net']}), AMCT record -> {kdir / st['record']}")
    if not st["deploy_air"]:
        print(f"SKIPPED deploy AIR export: {st['deploy_air_skipped']}")
    print(f"FP32 network -> {kdir / st['model_file']}, FP32 ONNX (graph IR) -> {kdir / st['fp32_onnx']}")
    if st["air"]:
        print(f"exported FP32 AIR -> {kdir / st['air']}")
    else:
        print(f"SKIPPED AIR export: {st['air_skipped']}")
    cache.mark_done(kdir, "export")


@guarded
def do_aipp():
    from quantflow.backends.aipp import build_and_verify

    c = cfg()
    kdir = stage_dir("aipp")
    report = build_and_verify(c, _calibration_paths(), kdir / "aipp.cfg")
    _write_json(kdir / "aipp_check.json", report)
    print(f"AIPP config {kdir / 'aipp.cfg'} verified on {report['images']} calibration images "
          f"(largest |diff| {report['max_abs_diff']:.2e}, tolerance {report['tolerance']})")
    cache.mark_done(kdir, "aipp")


def _atc_state() -> dict:
    from quantflow.backends.atc import find_atc
    atc = find_atc()
    return {"atc": str(atc) if atc else None}


@guarded
def do_atc():
    from quantflow.pipeline.stages import atc_stage

    kdir = stage_dir("atc")
    atc_stage(cfg(), kdir, stage_dir("export"), stage_dir("aipp"))
    cache.mark_done(kdir, "atc")


def _atc_uptodate() -> bool:
    """The cached atc result stands only while atc's availability is unchanged."""
    try:
        recorded = json.loads((stage_dir("atc") / "atc.json").read_text())
    except (OSError, ValueError):
        return False
    return recorded.get("atc") == _atc_state()["atc"]


@guarded
def do_gate():
    from quantflow.pipeline.stages import gate_stage

    kdir = stage_dir("gate")
    gate_stage(cfg(), kdir, stage_dir("graph"), stage_dir("calibrate"), stage_dir("fallback"), stage_dir("aipp"))
    cache.mark_done(kdir, "gate")


def _summary() -> dict:
    d = {stage: stage_dir(stage) for stage in cache.UPSTREAM}
    atc = json.loads((d["atc"] / "atc.json").read_text())
    gate = json.loads((d["gate"] / "accuracy_report.json").read_text())
    export = json.loads((d["export"] / "export.json").read_text())

    def path(stage: str, name: str | None) -> str | None:
        return str(d[stage] / name) if name else None

    return {"keys": {stage: stage_key(stage)[0] for stage in d}, "artifacts": {stage: str(p) for stage, p in d.items()},
            "qparams": path("fallback", "qparams.json"), "graph_onnx": path("graph", "graph.onnx"),
            "deploy_onnx": path("export", export["deploy_onnx"]), "deploy_mindir": path("export", export["deploy_mindir"]),
            "deploy_air": path("export", export.get("deploy_air")), "record": path("export", export["record"]),
            "mindir": path("export", export["mindir"]), "air": path("export", export["air"]),
            "model_file": path("export", export["model_file"]),
            "aipp_config": path("aipp", "aipp.cfg"), "om": path("atc", atc.get("om")),
            "atc": atc["status"] if atc["status"] != "skipped" else f"skipped: {atc['reason']}",
            "gate": {"passed": gate["passed"], "metric": metric(gate).name, "verdict": metric(gate).verdict(gate),
                     **{k: gate[k] for k in metric(gate).summary_keys}},
            "accuracy_report": path("gate", "accuracy_report.txt"), "report": path("gate", "report.html"),
            "sensitivity": path("calibrate", "sensitivity.json"),
            "float16_fallback": [f["scope"] for f in
                                 json.loads((d["fallback"] / "fallback.json").read_text())["float_ops"]]}


def do_summary():
    s = _summary()
    _write_json(latest_path(), s)
    print("artifacts: " + ", ".join(f"{stage} {key}" for stage, key in s["keys"].items()))
    for k in ("qparams", "deploy_onnx", "deploy_mindir", "deploy_air", "record", "mindir", "graph_onnx", "air",
              "aipp_config", "om", "accuracy_report", "sensitivity"):
        print(f"  {k:<16} {s[k] or '-'}")
    print(f"  {'atc':<16} {s['atc']}")
    g = s["gate"]
    print(f"  {'gate':<16} {'PASS' if g['passed'] else 'FAIL'}: {g['verdict']}")
    if s["float16_fallback"]:
        print(f"  {'float16 layers':<16} {', '.join(s['float16_fallback'])}")
    print(f"build report: {s['report']}")


def _summary_uptodate() -> bool:
    try:
        return json.loads(latest_path().read_text()) == json.loads(json.dumps(_summary()))
    except (OSError, ValueError, KeyError):
        return False


# ----------------------------------------------------------------------------- tasks

def task_preflight():
    """Cheap checks of the network, data and preprocessing, before any expensive stage."""
    c = cfg()
    model_file = c.path(c.model.checkpoint) if c.model.checkpoint and c.train is None else (
        c.path(c.model.mindir or c.model.onnx) if (c.model.mindir or c.model.onnx) else None)
    digest = cache.file_sha256(model_file) if model_file and model_file.is_file() else None
    return {
        "actions": [do_preflight],
        "file_dep": _module_file(c.model.entry) if c.model.entry else [],
        "uptodate": [config_changed({
            "config": c.canonical_json(), "model_file": digest,
            "aipp_source": cache.aipp_source_digest(c),
            "images": [cache.folder_digest(c.path(c.calibration.data_dir)),
                       cache.folder_digest(c.path(c.evaluation.data_dir))]})],
        "verbosity": 2,
    }


def task_train():
    """Train the model with [train].entry (only when the config has a [train] section)."""
    c = cfg()
    if c.train is None:
        return {"actions": None, "uptodate": [True], "task_dep": ["preflight"],
                "doc": "no [train] section: model.checkpoint is used as given"}
    ckpt = c.path(c.model.checkpoint)
    return {
        "actions": [do_train],
        "task_dep": ["preflight"],
        "targets": [str(ckpt)],
        "uptodate": [_train_uptodate],
        "verbosity": 2,
    }


def task_sample():
    """Stage 1: stratified, seeded calibration sampling -> manifest."""
    from quantflow.images import IMAGE_EXTS

    c = cfg()
    data_dir = c.path(c.calibration.data_dir)
    files = sorted(str(p) for p in data_dir.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTS) \
        if data_dir.is_dir() else []
    return {
        "actions": [do_sample],
        "targets": [str(manifest_path())],
        "clean": True,
        "file_dep": files,
        "task_dep": ["train"],
        "uptodate": [config_changed({"calibration": c.calibration.model_dump(mode="json"),
                                     "shape": list(c.model.input_shape), "classes": c.labelled_classes})],
        "verbosity": 2,
    }


def _keyed(name: str, action, outputs: list[str], task_dep: list[str], doc: str, uptodate=None) -> dict:
    kdir = stage_dir(name)
    return {
        "doc": doc,
        "actions": [action],
        "targets": [str(kdir / o) for o in outputs] + [str(cache.done_marker(kdir, name))],
        "task_dep": task_dep,
        "uptodate": uptodate or [True],
        "clean": True,
        "verbosity": 2,
    }


@create_after(executed="sample")
def task_graph():
    """Stage 3a: the network's MindIR read into the graph IR, checked against MindSpore."""
    return _keyed("graph", do_graph, ["graph.json", "graph.onnx"], ["sample"], task_graph.__doc__)


@create_after(executed="sample")
def task_calibrate():
    """Stage 2: observers on every quantized op's input, activation ranges, Ascend INT8 parameters."""
    return _keyed("calibrate", do_calibrate, ["qparams.json", "qparams.npz", "calibration.txt", "sensitivity.json",
                                              "histograms.npz"], ["graph"],
                  task_calibrate.__doc__)


@create_after(executed="sample")
def task_fallback():
    """Stage 2b: the INT8 parameters used: as calibrated, or (fallback = "auto") the most sensitive ops in float16."""
    return _keyed("fallback", do_fallback, ["qparams.json", "qparams.npz", "fallback.json"],
                  ["calibrate"] + (["aipp"] if cfg().quantization.fallback == "auto" else []), task_fallback.__doc__)


@create_after(executed="sample")
def task_export():
    """Stage 3b: the INT8 deploy graph (ONNX) and AMCT record; FP32 MindIR, AIR when the Ascend backend is available."""
    return _keyed("export", do_export, ["export.json", "deploy.onnx", "deploy.mindir", "record.txt"],
                  ["fallback"],
                  task_export.__doc__)


@create_after(executed="sample")
def task_aipp():
    """Stage 4: AIPP config from the training normalization, verified on calibration images."""
    return _keyed("aipp", do_aipp, ["aipp.cfg", "aipp_check.json"], ["sample"], task_aipp.__doc__)


@create_after(executed="sample")
def task_atc():
    """Stage 5: atc conversion to an .om for build.soc_version (a reported skip without CANN)."""
    return _keyed("atc", do_atc, ["atc.json"], ["export", "aipp"], task_atc.__doc__, uptodate=[_atc_uptodate])


@create_after(executed="sample")
def task_gate():
    """Stage 6: INT8 emulation vs FP32 on held-out images; fails over evaluation.threshold."""
    return _keyed("gate", do_gate, ["accuracy_report.json", "accuracy_report.txt", "report.html"], ["fallback", "aipp"],
                  task_gate.__doc__)


@create_after(executed="sample")
def task_summary():
    """Write <output_dir>/latest.json naming the current artifacts."""
    return {
        "doc": task_summary.__doc__,
        "actions": [do_summary],
        "task_dep": ["atc", "gate"],
        "uptodate": [_summary_uptodate],
        "verbosity": 2,
    }
