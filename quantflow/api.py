"""quantflow's Python API: build one configuration, or quantize a model from two image folders in one call.

    import quantflow

    result = quantflow.build("quantflow.toml")             # every stage, as `quantflow build` runs them
    result = quantflow.quantize("model.onnx", "calib/", "eval/", mean=[0.485, 0.456, 0.406],
                                std=[0.229, 0.224, 0.225], output_dir="build")
    result.verdict, result.passed, result.figures, result.artifacts["deploy_onnx"], result.report_html

A failing gate is a result (``passed`` false, ``verdict`` "FAIL" or "UNDECIDED"), not an exception.  A bad
configuration or input raises quantflow's own error (``quantflow.errors``: ``ConfigError`` naming the file and the
field, ``DataError`` naming the image, ...).  The command line (``quantflow build``) is a thin layer over
``build``: it prints what the build prints and turns the result into an exit code.
"""
from __future__ import annotations

import difflib
import json
import os
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Literal, Mapping, Union

from .config import BASELINE_ENV, DEFAULT_CONFIG_NAME, QuantflowConfig, config_from_dict
from .errors import AccuracyGateError, ConfigError, QuantflowError

__all__ = ["BuildResult", "Figure", "build", "quantize"]

Verdict = Literal["PASS", "FAIL", "UNDECIDED"]


@dataclass(frozen=True)
class Figure:
    """One figure of the accuracy gate, as ``accuracy_report.json`` holds it.

    Attributes:
        id: a stable identifier, e.g. ``"drop"`` or ``"agreement"``.
        label: what the report calls it.
        value: measured on the held-out images (None where the metric gave no value).
        low: the low end of its bootstrap interval at ``evaluation.confidence`` (None where it has none).
        high: the high end of that interval.
        limit: the configured limit it is judged against.
        kind: ``"min"`` (the value must reach the limit) or ``"max"`` (it must stay within it).
        verdict: ``"PASS"``, ``"FAIL"`` or ``"UNDECIDED"`` (the interval straddles the limit).
        gated: false for a figure that is reported only, never failing the build.
    """
    id: str
    label: str
    value: float | None
    low: float | None
    high: float | None
    limit: float | None
    kind: str | None
    verdict: str
    gated: bool = True

    @classmethod
    def from_report(cls, f: Mapping) -> "Figure":
        return cls(id=str(f.get("id", f.get("label"))), label=str(f.get("label", f.get("id"))), value=f.get("value"),
                   low=f.get("low"), high=f.get("high"), limit=f.get("limit"), kind=f.get("kind"),
                   verdict=str(f.get("verdict")), gated=bool(f.get("gated", True)))


@dataclass(frozen=True)
class Float16Floor:
    """INT8 beside the float16 floor: the same held-out images through the device's float16-only path (no op in
    INT8), as ``accuracy_report.json``'s ``distance`` and ``float16`` hold them (docs/accuracy.md).

    Attributes:
        unit: what is counted: ``"classes"``, ``"strings"``, ``"boxes"``, ``"pixels"``, or ``"output noise
            energy"`` for a metric with no discrete outcome.
        int8_changed: the outcomes INT8 changes against FP32 on the held-out images.
        float16_changed: the outcomes the float16-only path changes on the same images.
        ratio: INT8's over float16's (float16's count taken as at least 1), with its bootstrap interval ``low`` ..
            ``high``; what ``evaluation.max_vs_float16`` limits.
        int8_mac_share: the share of the quantizable ops' multiply-adds that run in INT8.
        float16_verdict: the float16-only path's verdict against the gate's own limits.
        float16_figures: its gated figures, as ``Figure``.
    """
    unit: str
    int8_changed: float
    float16_changed: float
    ratio: float
    low: float | None
    high: float | None
    int8_mac_share: float | None
    float16_verdict: str
    float16_figures: tuple[Figure, ...]

    @classmethod
    def from_report(cls, report: Mapping) -> "Float16Floor | None":
        d, f = report.get("distance"), report.get("float16")
        if not d or not f:
            return None
        return cls(unit=d["unit"], int8_changed=d["int8_changed"], float16_changed=d["float16_changed"],
                   ratio=d["ratio"], low=d["low"], high=d["high"], int8_mac_share=d.get("int8_mac_share"),
                   float16_verdict=f["verdict"],
                   float16_figures=tuple(Figure.from_report(x) for x in f.get("figures", [])))


@dataclass(frozen=True)
class BuildResult:
    """What one build gives: the gate's decision with its figures, the artifacts, the configuration used.

    Attributes:
        verdict: the figures' verdict, ``"PASS"``, ``"FAIL"`` or ``"UNDECIDED"``; None only when the stages asked
            for did not include the gate.
        passed: the gate's decision (an UNDECIDED verdict passes only as ``evaluation.on_undecided`` says).
        figures: every figure of the gate, with its interval, limit and verdict.
        artifacts: name -> path: each keyed stage's folder by stage name, and the files ``latest.json`` names
            (``deploy_onnx``, ``qparams``, ``aipp_config``, ``om``, ``accuracy_report`` (text), ``report`` (HTML),
            ...), the gate's files also for a build that failed.
        report: the gate's accuracy report (``accuracy_report.json``); empty without a gate.
        report_html: the self-contained HTML build report.
        config: the configuration the build used.
        config_file: the file it was read from.
        keys: each keyed stage's artifact key.
        float16_layers: the layers left in float16 on the device.
        floor: INT8 beside the float16-only path on the same images (``Float16Floor``); None without a gate.
    """
    verdict: Verdict | None
    passed: bool
    figures: tuple[Figure, ...]
    artifacts: dict[str, Path]
    report: dict
    report_html: Path | None
    config: QuantflowConfig
    config_file: Path | None
    keys: dict[str, str] = field(default_factory=dict)
    float16_layers: tuple[str, ...] = ()
    floor: Float16Floor | None = None

    @property
    def failures(self) -> tuple[str, ...]:
        """The figures that FAIL (and, with a baseline, those worse than it)."""
        return tuple(dict.fromkeys(self.report.get("failures", []) + self.report.get("worse", [])))

    def __str__(self) -> str:
        if self.verdict is None:
            return f"quantflow build of {self.config_file or self.config.root}: not gated in this run"
        said = "; ".join(_figure_text(f) for f in self.figures if f.gated)
        return f"{'PASS' if self.passed else 'FAIL'} ({self.verdict}): {said}"


def _figure_text(f: Figure) -> str:
    interval = "" if f.low is None else f" [{f.low:.4g}, {f.high:.4g}]"
    need = "" if f.limit is None else f" (needs {'>=' if f.kind == 'min' else '<='} {f.limit:g})"
    value = "-" if f.value is None else f"{f.value:.4g}"
    return f"{f.label} {value}{interval}{need} {f.verdict}"


# ----------------------------------------------------------------------------------------------------- build

def build(config: Union[str, os.PathLike, QuantflowConfig] = DEFAULT_CONFIG_NAME, *,
          cache: Union[str, os.PathLike, bool, None] = None, always: Union[bool, Iterable[str]] = (),
          baseline: Union[str, os.PathLike, None] = None, stages: Iterable[str] = ()) -> BuildResult:
    """Build one configuration: every stage as ``quantflow build`` runs it (the doit task graph, in this process),
    each stage found done under its artifact key skipped.

    - ``config``: a quantflow.toml path, or a configuration already loaded (``quantflow.config.load_config``).
    - ``cache``: the shared artifact cache: a folder or an fsspec URL (``s3://bucket/prefix``); False: none;
      None: ``$QUANTFLOW_CACHE``, else the configuration's ``[cache] url``.
    - ``always``: stage names to run again even where up to date; True: every stage.
    - ``baseline``: a previous build's accuracy_report.json or output folder (``evaluation.baseline``).
    - ``stages``: run only these stages and what they need (default: all).

    Returns the ``BuildResult``; a failing gate is a result.  Raises ``quantflow.errors.QuantflowError`` (a
    ``ConfigError`` naming the file and field, a ``DataError`` naming the image, ...) where the configuration or an
    input is at fault or a stage before the gate fails."""
    from .pipeline import doit_graph

    stages = _stage_names(stages)
    rerun = set(doit_graph.DEFAULT_TASKS) if always is True else set(_stage_names(always or ()))
    saved = os.environ.get(BASELINE_ENV)
    if baseline is not None:
        from .evaluation.baseline import locate
        locate(Path(baseline), "baseline")
        os.environ[BASELINE_ENV] = str(Path(baseline).resolve())
    try:
        tasks = doit_graph.namespace(config, cache=cache)
        b = doit_graph.build()
        code = _run_doit(tasks, b, stages, rerun)
    finally:
        if saved is None:
            os.environ.pop(BASELINE_ENV, None)
        else:
            os.environ[BASELINE_ENV] = saved
    return _result(b, code, stages)


def _stage_names(names: Iterable[str]) -> list[str]:
    from .pipeline.doit_graph import DEFAULT_TASKS

    names = [names] if isinstance(names, str) else list(names)
    for n in names:
        if n not in DEFAULT_TASKS:
            raise ConfigError(f"unknown stage {n!r}; the stages are {', '.join(DEFAULT_TASKS)}")
    return names


def _run_doit(tasks: dict, b, stages: list[str], rerun: set[str]) -> int:
    """doit's own ``run`` of the build's task graph ``tasks`` (the stages, or all), the stages in ``rerun`` made to
    run again first; doit's output goes to this process's sys.stdout.  doit's exit code."""
    from doit.cmd_base import ModuleTaskLoader
    from doit.doit_cmd import DoitMain

    from .pipeline.doit_graph import DEFAULT_TASKS
    from .tasks import STAGES
    from .tasks.stage import done_marker

    def doit(*args) -> int:
        # doit's own default output stream is the sys.stdout of the moment doit was imported: give it this one
        return DoitMain(ModuleTaskLoader(tasks), extra_config={"GLOBAL": {"outfile": sys.stdout}}).run(list(args))

    b.rebuild = set(rerun)   # run again, not pulled from the artifact cache
    if rerun >= set(DEFAULT_TASKS):
        return doit("run", "--always-execute", *stages)
    for name in sorted(rerun):
        if STAGES[name].keyed:   # done exactly when its completion marker exists under its key
            if _has_keys(b):
                done_marker(b.dir(name, create=False), name).unlink(missing_ok=True)
        else:                    # tracked by doit's own state
            doit("forget", name)
    return doit("run", *stages)


def _result(b, code: int, stages: list[str]) -> BuildResult:
    """The build's outcome: its gate's report under the current key where the gate ran (passed or not), else the
    error a stage raised."""
    from .io.files import JUNIT_XML, REPORT_HTML, REPORT_JSON, REPORT_TXT, SUMMARY_MD
    from .tasks.summary import latest_path

    failure = getattr(b, "failure", None)
    gate_ran = not stages or "gate" in stages or "summary" in stages
    report_file = b.dir("gate", create=False) / REPORT_JSON if gate_ran and _has_keys(b) else None
    gate_failed = isinstance(failure, AccuracyGateError)
    if code != 0 and not gate_failed:
        err = failure if isinstance(failure, QuantflowError) else QuantflowError(
            f"{b.config_file or b.cfg.root}: the build stopped (doit exit code {code}); its output above says where")
        err.exit_code, err.printed = code, True   # the build's output has said it; the command line's exit code
        raise err
    report = json.loads(report_file.read_text()) if report_file is not None and report_file.is_file() else {}
    keys, artifacts = {}, {}
    if _has_keys(b):
        for s in b.stages():
            if s.keyed and b.done(s.name):
                keys[s.name], artifacts[s.name] = b.key(s.name), b.dir(s.name, create=False)
    latest = latest_path(b.cfg)
    if report and report.get("passed") and latest.is_file():
        named = json.loads(latest.read_text())
        if named.get("keys") == keys:   # latest.json names this build's artifacts
            artifacts.update({k: Path(v) for k, v in named.items() if isinstance(v, str) and v and Path(v).exists()})
    if report:   # the gate's files under latest.json's names, for a build that failed too
        gate = b.dir("gate", create=False)
        artifacts.update({"accuracy_report": gate / REPORT_TXT, "accuracy_report_json": gate / REPORT_JSON,
                          "report": gate / REPORT_HTML, "junit": gate / JUNIT_XML, "gate_summary": gate / SUMMARY_MD})
    verdict = report.get("verdict") or ({True: "PASS", False: "FAIL"}.get(report.get("passed")) if report else None)
    return BuildResult(
        verdict=verdict, passed=bool(report.get("passed", False)) if report else code == 0,
        figures=tuple(Figure.from_report(f) for f in report.get("figures", [])), artifacts=artifacts, report=report,
        report_html=(b.dir("gate", create=False) / REPORT_HTML) if report else None, config=b.cfg,
        config_file=b.config_file, keys=keys,
        float16_layers=tuple(f["layer"] for f in report.get("float16_layers", [])),
        floor=Float16Floor.from_report(report) if report else None)


def _has_keys(b) -> bool:
    """Are the artifact keys known (they hash the calibration manifest, written by ``sample``)."""
    from .tasks.sample import manifest_path
    return manifest_path(b.cfg).is_file()


# ----------------------------------------------------------------------------------------------------- quantize

def quantize(model: Union[str, os.PathLike], calibration: Union[str, os.PathLike],
             evaluation: Union[str, os.PathLike, None] = None, *, output_dir: Union[str, os.PathLike] = "build",
             checkpoint: Union[str, os.PathLike, None] = None, input_shape: Iterable[int] | None = None,
             config: Mapping[str, Mapping] | None = None, cache: Union[str, os.PathLike, bool, None] = None,
             **options) -> BuildResult:
    """Quantize ``model`` for the device and judge it, in one call.

    - ``model``: an ONNX or MindIR file, or ``"package.module:function"`` building a MindSpore network (with
      ``checkpoint``, its trained weights).
    - ``calibration``: a folder of real images (per-class sub-folders for a classifier); ``evaluation``: a folder of
      held-out images the gate judges INT8 on (required: the calibration images set the ranges and cannot judge).
    - ``output_dir``: where the build goes; the configuration is written there as ``quantflow.toml`` (paths relative
      to it, ``build.output_dir = "."``), so ``quantflow build <output_dir>/quantflow.toml`` repeats the build.
    - ``options``: configuration fields by name, each in the one section that has it (``mean``, ``std``, ``scale``,
      ``channel_order``, ``metric``, ``threshold``, ``min``, ``max``, ``fallback``, ``method``, ``count``, ...);
      ``config``: whole sections (``{"evaluation": {"seed": 1}}``) for names several sections share.

    The configuration starts as ``quantflow init`` writes it for these files (the head recognised, the gate chosen,
    its default limits); ``options`` and ``config`` are applied over it.  Returns ``build``'s ``BuildResult``.
    Raises ``quantflow.errors.ConfigError`` naming the option or field at fault."""
    if evaluation is None:
        raise ConfigError("quantflow.quantize: evaluation: give a folder of held-out images; the gate judges INT8 on "
                          "them (the calibration images set the ranges and cannot judge them)")
    out = Path(output_dir).resolve()
    source = _model_source(model, checkpoint)
    data = _init_data(out, Path(calibration).resolve(), Path(evaluation).resolve(),
                      list(input_shape) if input_shape else None, source)
    data.setdefault("build", {})["output_dir"] = "."
    for section, values in (config or {}).items():
        if not isinstance(values, Mapping):
            raise ConfigError(f"quantflow.quantize: config[{section!r}] must be a table (a dict of fields)")
        data[section] = {**data.get(section, {}), **_plain(values)}
    for name, value in options.items():
        section = _section_of(name)
        data.setdefault(section, {})[name] = _plain(value)
    path = out / DEFAULT_CONFIG_NAME
    config_from_dict(data, root=out, source=f"quantflow.quantize(..., output_dir={str(output_dir)!r})")
    from .io.atomic import write_text
    from .io.toml import dumps

    write_text(path, dumps(data, header=f"quantflow configuration written by quantflow.quantize(); repeat the build "
                                        f"with `quantflow build {path}`. Paths are relative to this file."))
    return build(path, cache=cache)


def _init_data(out: Path, calib: Path, evaluation: Path, input_shape, source: dict) -> dict:
    """The configuration ``quantflow init`` writes for these files (paths relative to ``out``), as data."""
    from .scaffold import write

    tmp = out / f".{DEFAULT_CONFIG_NAME}.init-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    try:
        write(tmp, calib=calib, eval=evaluation, input_shape=input_shape, **source)
        return _read_toml(tmp)
    finally:
        tmp.unlink(missing_ok=True)


def _model_source(model, checkpoint) -> dict:
    text = str(model)
    suffix = Path(text).suffix.lower()
    if suffix == ".onnx":
        return {"onnx": Path(text).resolve()}
    if suffix == ".mindir":
        return {"mindir": Path(text).resolve()}
    if ":" in text and not Path(text).exists():
        if checkpoint is None:
            raise ConfigError(f"quantflow.quantize: model {text!r} is an entry point; give checkpoint= (its trained "
                              f"weights)")
        return {"entry": text, "checkpoint": Path(checkpoint).resolve()}
    raise ConfigError(f"quantflow.quantize: model {text!r}: give an .onnx or .mindir file, or 'package.module:function' "
                      f"with checkpoint=")


def _section_of(name: str) -> str:
    """The one configuration section that has field ``name``; a ConfigError naming it where none or several do."""
    sections = {s: info.annotation for s, info in QuantflowConfig.model_fields.items() if s != "root"}
    having = [s for s, cls in sections.items() if name in _fields(cls)]
    if len(having) == 1:
        return having[0]
    if having:
        raise ConfigError(f"quantflow.quantize: option {name!r} is a field of several sections ({', '.join(having)}); "
                          f"give it as config={{'{having[0]}': {{'{name}': ...}}}}")
    known = sorted({f for cls in sections.values() for f in _fields(cls)})
    close = difflib.get_close_matches(name, known, n=3)
    raise ConfigError(f"quantflow.quantize: unknown option {name!r}"
                      + (f" (did you mean {', '.join(close)}?)" if close else "; see the configuration reference"))


def _fields(annotation) -> set[str]:
    from typing import get_args
    from pydantic import BaseModel

    classes = [a for a in (annotation, *get_args(annotation)) if isinstance(a, type) and issubclass(a, BaseModel)]
    return {f for c in classes for f in c.model_fields}


def _plain(value):
    """Options as TOML-able data: paths as strings, tuples as lists, mappings as dicts."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def _read_toml(path: Path) -> dict:
    return tomllib.loads(Path(path).read_text(encoding="utf-8"))
