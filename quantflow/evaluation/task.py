"""Task metrics: the user's own post-processing on the FP32 and INT8 outputs, and the gate on the numbers it returns
(``evaluation.metric = "module:callable"``; ``"detection"`` is the shipped one, ``detection.Detection``).

A task metric is given, for every evaluation batch, the FP32 outputs, the INT8 emulation's outputs (each a dict
network output name -> array, the images first) and the batch (``Batch``: the images' paths, their names as the
report shows them, the uint8 images as the device receives them), plus ``evaluation.options`` as keyword
arguments.  Two forms:

- a **function** ``f(fp32, int8, batch, **options)`` returning {name: one value per image of the batch}; the
  gate's number ``name`` is the mean over all held-out images (e.g. the share of text lines both read alike);
- a **class** ``C(**options)`` with ``batch(fp32, int8, batch)`` returning a record of the batch (small,
  picklable: counts, detections) and ``summarize(records)`` turning the records of all batches, in image order,
  into {name: number or None (not measured)}; a class attribute ``limits`` ({"min": {...}, "max": {...}}) holds
  its default limits.  With the class attribute ``records_per_image = True`` (the shipped metrics), ``batch``
  returns a list of one record per image and ``summarize`` takes any flat list of such records (a bootstrap
  draw repeats some): the intervals then draw images; otherwise they draw batches.  A class may also have
  ``steering(records)`` returning {"figure": text, "value": number, "error": number} or None: a low-variance
  figure of INT8 against FP32 (``error`` the lower the better) that the fallback steers by where the metric's
  numbers fail (``steering.py``; the shipped ``detection`` metric's: the SQNR of the scores and boxes near
  the threshold), instead of the least SQNR of the outputs.  A class with per-image records may also have
  ``changed(record)`` returning the number of task outcomes INT8 changes against FP32 in that image, and ``outcome``
  naming them ("boxes", "strings", "pixels"): what the float16 floor counts (``floor.py``); without it the floor
  compares the outputs' noise energy.

Every limited number gets a bootstrap interval and a verdict (``intervals``, ``verdicts``): the function form's
per-image values are re-averaged per draw, the records re-summarized per draw.

The gate passes when every number named in ``evaluation.min`` / ``evaluation.max`` (merged over the metric's
defaults) is at least / at most its limit (its interval against the limit: docs/release-gate.md), and every part of ``evaluation.parts`` meets its own (the outputs'
and parts' cosine and SQNR are measured in the same pass and shown).  Only one batch of outputs is held at a
time; the batches and their records are the same however the images are sharded (shards are contiguous runs of
whole batches, the records are summarized in image order), so the numbers are too.
"""
from __future__ import annotations

import math
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..entry import load_entry
from ..errors import ConfigError, QuantflowError
from ..quantization.deploy import quantized_graph
from .floor import changed_outcomes, energy_changed
from .intervals import Resampling, mean_replicates, record_replicates, resampling
from .intervals import figure as figure_of
from .outputs import failing_outputs, failure_text, network_regions, region_rows, rows_details, rows_text
from .protocol import Series, in_float
from .runs import Fp32Memo, both_outputs, memo_sharded, region_sums
from .shipped import SHIPPED
from .steering import region_steering
from .verdicts import attach, explain, mark_rows, region_figures, with_intervals


@dataclass(frozen=True)
class Batch:
    """One evaluation batch as a task metric sees it."""
    paths: tuple[Path, ...]       # the image files
    names: tuple[str, ...]        # the paths as the report shows them (relative to the config's folder)
    images: np.ndarray            # uint8 N,H,W,3 BGR (N,H,W gray): what the device is fed


def entry_of(metric: str) -> str:
    """The ``module:callable`` of ``evaluation.metric`` (a shipped metric's by its name, ``shipped.SHIPPED``)."""
    return SHIPPED.get(metric, metric)


class TaskMetric:
    """The metric ``evaluation.metric`` names, loaded with ``evaluation.options``."""

    def __init__(self, metric: str, options: dict):
        self.metric, self.entry, self.options = metric, entry_of(metric), dict(options)
        # the callable itself, not load_entry's wrapper: _call says where its errors happened (file, line, batch)
        obj = load_entry(self.entry, "evaluation.metric").__wrapped__
        self.defaults = {"min": {}, "max": {}}
        self.per_image = not isinstance(obj, type)    # the function form: per-image values, averaged
        self.records_per_image = bool(getattr(obj, "records_per_image", False)) and not self.per_image
        if not self.per_image:
            try:
                inst = obj(**self.options)
            except TypeError as err:
                raise ConfigError(f"evaluation.options: {self.entry} does not take {sorted(self.options)}: "
                                  f"{err}") from None
            missing = [m for m in ("batch", "summarize") if not callable(getattr(inst, m, None))]
            if missing:
                raise ConfigError(f"evaluation.metric: class {self.entry} lacks method(s) {', '.join(missing)} "
                                  f"(a task metric class has batch(fp32, int8, batch) and summarize(records))")
            self._batch, self._summarize = inst.batch, inst.summarize
            own = getattr(inst, "steering", None)
            self._steering = own if callable(own) else None
            counts = getattr(inst, "changed", None)
            if callable(counts) and self.records_per_image:
                self._changed, self.outcome = counts, str(getattr(inst, "outcome", "outcomes"))
            for kind, limits in getattr(obj, "limits", {}).items():
                self.defaults[kind] = dict(limits)
        else:
            self._batch = lambda fp32, int8, batch: obj(fp32, int8, batch, **self.options)
            self._summarize, self._steering = self._means, None

    _changed, outcome = None, None   # a per-image class's changed(record) and the unit it counts

    def changed(self, records: list, stats: np.ndarray, regions: list) -> dict:
        """``floor.changed_outcomes`` of the images of ``records``: the metric's ``changed(record)`` per image (the
        outcomes INT8 changes against FP32 in it, counted in its ``outcome``: boxes, strings, pixels) where it has
        one (with ``records_per_image``), else the outputs' noise energy per image (``floor.energy_changed``)."""
        if self._changed is None:
            return energy_changed(stats, regions)
        counts = []
        for i, rec in enumerate(records):
            v = self._call(self._changed, rec, where=f"in changed, on the record of image {i}")
            try:
                counts.append(float(v))
            except (TypeError, ValueError):
                raise QuantflowError(f"evaluation.metric {self.metric}: changed returned {type(v).__name__}, not a "
                                     f"number of changed outcomes") from None
        return changed_outcomes(self.outcome, counts)

    def record(self, fp32: dict, int8: dict, batch: Batch):
        """The metric's record of one batch (the function form: its per-image values, checked)."""
        out = self._call(self._batch, fp32, int8, batch, where=f"on the batch from {batch.names[0]}")
        if self.records_per_image and (not isinstance(out, list) or len(out) != len(batch.paths)):
            raise QuantflowError(f"evaluation.metric {self.metric}: records_per_image is set, but batch() returned "
                                 f"{len(out) if isinstance(out, list) else type(out).__name__} record(s) for a batch "
                                 f"of {len(batch.paths)} images (a list of one record per image)")
        if self.per_image:
            if not isinstance(out, dict) or not out:
                raise QuantflowError(f"evaluation.metric {self.metric}: returned {type(out).__name__}, not a dict "
                                     f"{{name: one value per image}}")
            checked = {}
            for k, v in out.items():
                try:
                    values = np.asarray(v, np.float64).reshape(-1)
                except (TypeError, ValueError):
                    raise QuantflowError(f"evaluation.metric {self.metric}: {k!r} is not numbers "
                                         f"({type(v).__name__})") from None
                if len(values) != len(batch.paths):
                    raise QuantflowError(f"evaluation.metric {self.metric}: {k!r} has {len(values)} value(s) for a "
                                         f"batch of {len(batch.paths)} images (one value per image)")
                checked[str(k)] = values
            out = checked
        return out

    def summarize(self, records: list) -> dict:
        """{name: number or None (not measured: None or NaN)} over all batches' records, in image order."""
        numbers = self._call(self._summarize, records, where="in summarize")
        if not isinstance(numbers, dict):
            raise QuantflowError(f"evaluation.metric {self.metric}: summarize returned {type(numbers).__name__}, "
                                 f"not a dict {{name: number}}")
        out = {}
        for k, v in numbers.items():
            try:
                out[str(k)] = None if v is None or math.isnan(float(v)) else float(v)
            except (TypeError, ValueError):
                raise QuantflowError(f"evaluation.metric {self.metric}: summarize returned {type(v).__name__} for "
                                     f"{k!r}, not a number") from None
        return out

    def steering(self, records: list) -> dict | None:
        """The metric's own steering figure over the records (its ``steering``), checked; None without one."""
        if self._steering is None:
            return None
        out = self._call(self._steering, records, where="in steering")
        if out is None:
            return None
        try:
            checked = {"figure": str(out["figure"]), "value": float(out["value"]), "error": float(out["error"])}
            regions = {str(k): float(v) for k, v in (out.get("regions") or {}).items()}
        except (TypeError, KeyError, ValueError, AttributeError):
            raise QuantflowError(f"evaluation.metric {self.metric}: steering returned {out!r}, not None or a dict "
                                 f"{{figure: text, value: number, error: number}}") from None
        return {**checked, "regions": regions}

    @staticmethod
    def _means(records: list) -> dict:
        names = list(dict.fromkeys(k for r in records for k in r))
        return {k: float(np.mean(np.concatenate([r[k] for r in records if k in r]))) for k in names}

    def _call(self, fn, *args, where: str):
        try:
            return fn(*args)
        except QuantflowError:
            raise
        except Exception as err:  # the user's code: its error, where it happened, no traceback
            frame = traceback.extract_tb(err.__traceback__)[-1]
            raise QuantflowError(f"evaluation.metric {self.metric} raised {type(err).__name__}: {err} (at "
                                 f"{frame.filename}:{frame.lineno}, {where})") from None


def _task_shard(shared, paths) -> tuple[np.ndarray, list, dict | None]:
    ev, graph, deploy, aipp_params, regions, metric, options, names, fp32, keep = shared
    task = TaskMetric(metric, options)
    shown = dict(zip(ev.paths, ev.names))
    stats, records, kept = [], [], {} if keep else None
    for batch_paths, images, fp, q in both_outputs(ev, graph, deploy, aipp_params, paths, names, fp32=fp32,
                                                   keep=kept):
        stats.append(region_sums(fp, q, regions, len(images)))
        record = task.record(fp, q, Batch(tuple(batch_paths), tuple(shown[p] for p in batch_paths), images))
        records.extend(record) if task.records_per_image else records.append(record)
    return (np.concatenate(stats) if stats else np.zeros((0, len(regions), 5))), records, kept


def task_run(ev, graph, deploy, aipp_params: dict, regions: list, metric: str, options: dict,
             names: dict | None = None, memo: Fp32Memo | None = None) -> tuple[np.ndarray, list]:
    """(``runs.region_sums`` of every held-out image, the task metric's records in image order: one per batch, or
    one per image for a metric with ``records_per_image``), sharded over ``ev.engine`` with the single process's
    results; outputs named as ``runs.output_names`` says; FP32 reused from (or kept in) ``memo``."""
    parts = memo_sharded(_task_shard, (ev, graph, deploy, aipp_params, regions, metric, dict(options), names), ev,
                         memo)
    return np.concatenate([s for s, _, _ in parts]), [r for _, rs, _ in parts for r in rs]


def steering_of(own: dict | None, regions: dict | None) -> dict | None:
    """A task check's steering figure: the metric's own (``TaskMetric.steering``) where it has one, carrying the
    outputs' and parts' SQNRs beside its own regions (so that a check failing on a part is still judged by that
    part: ``steering.helps``); else the least SQNR of the outputs and parts."""
    if own is None:
        return regions
    return {**own, "regions": {**(regions or {}).get("regions", {}), **own["regions"]}}


def number_figures(metric: TaskMetric, records: list, checks: list[dict], r: Resampling, limits,
                   n: int) -> tuple[list[dict], dict]:
    """(a figure per limited number with its bootstrap interval, the draws by id): the function form's per-image
    values re-averaged over each draw of images; per-image records (``records_per_image``) re-summarized over
    each draw of images; other records (one per batch) over draws of batches."""
    if not checks:
        return [], {}
    wanted = [c["number"] for c in checks]
    if metric.per_image:
        draws = {k: mean_replicates(r, np.concatenate([rec[k] for rec in records])) for k in wanted}
    else:
        rr = r if metric.records_per_image else resampling(np.zeros(len(records), int), r.resamples, r.seed,
                                                            r.confidence)
        summaries = record_replicates(rr, records, metric.summarize)
        draws = {k: np.asarray([np.nan if s.get(k) is None else s[k] for s in summaries], np.float64) for k in wanted}
    figures = [figure_of(c["number"], c["number"], c["number"], c["value"], c["limit"], c["kind"], draws[c["number"]],
                      n, r.confidence) for c in checks]
    return figures, draws


def judge(numbers: dict, limits, defaults: dict) -> list[dict]:
    """Each limit on the metric's numbers -- ``defaults`` ({"min": {...}, "max": {...}}) with the configured
    ``evaluation.min`` / ``evaluation.max`` over them -- as {"number", "kind", "limit", "value", "passed"}.  A
    configured limit on a number the metric does not return is a ConfigError; a default one is left out."""
    checks = []
    for kind in ("min", "max"):
        given = dict(getattr(limits, kind))
        for name, limit in {**defaults.get(kind, {}), **given}.items():
            if name not in numbers:
                if name in given:
                    raise ConfigError(f"evaluation.{kind}.{name}: evaluation.metric {limits.metric} returns no number "
                                      f"{name!r} (it returns: {', '.join(numbers) or 'none'})")
                continue
            value = numbers[name]
            ok = value is not None and bool(value >= limit if kind == "min" else value <= limit)
            checks.append({"number": name, "kind": kind, "limit": float(limit), "value": value, "passed": ok})
    return checks


def _num(v) -> str:
    return "not measured" if v is None else f"{v:.4f}" if isinstance(v, float) and not v.is_integer() else f"{v:g}"


def _need(c: dict) -> str:
    return f"{'>=' if c['kind'] == 'min' else '<='} {c['limit']:g}"


class Task:
    name = "task"
    summary_keys = ("task", "numbers", "failures")
    step_keys = ("limits", "failures")

    def evaluate(self, ev, limits, graph, folded, qparams, aipp_params: dict, names: dict | None = None) -> dict:
        return self.checker(ev, limits, graph, folded, aipp_params, names)(qparams)

    def checker(self, ev, limits, graph, folded, aipp_params: dict, names: dict | None = None):
        """``check(qparams) -> report``: FP32 runs beside INT8, one batch at a time, at the first check (and at
        each where the images' outputs do not fit ``runs.Fp32Memo``)."""
        regions = network_regions(graph, limits, gate_whole=False, names=names)
        memo = Fp32Memo(graph, len(ev))
        metric = TaskMetric(limits.metric, dict(limits.options))   # it loads (and takes its options) before any run

        def check(qparams) -> dict:
            stats, records = task_run(ev, graph, quantized_graph(folded, qparams), aipp_params, regions,
                                      limits.metric, dict(limits.options), names, memo)
            numbers = metric.summarize(records)
            checks = judge(numbers, limits, metric.defaults)
            rows = region_rows(stats, regions, list(ev.names))
            report = {"images": int(len(stats)), "task": limits.metric, "entry": metric.entry, "numbers": numbers,
                      "limits": checks}
            r = resampling(ev.labels, limits.resamples, limits.seed, limits.confidence)
            figures, draws = number_figures(metric, records, checks, r, limits, len(stats))
            more, more_draws = region_figures(rows, stats, r)
            rows = mark_rows(with_intervals(rows, stats, r), more)
            report = attach(report, figures + more, {**draws, **more_draws}, r, limits, outputs=rows,
                            steering=steering_of(metric.steering(records), region_steering(rows)),
                            changed=metric.changed(records, stats, regions))
            for c in checks:   # each limit's verdict is its figure's
                c["passed"] = c["number"] not in report["failures"]
            return report
        return check

    def focus(self, r: dict) -> list[str] | None:
        """Failing parts point the fallback at their outputs; a failing number at the outputs pooled."""
        return failing_outputs(r.get("outputs", []), r["failures"]) or None

    def step_line(self, st: dict) -> str:
        said = ", ".join(f"{c['number']} {_num(c['value'])}" for c in st["limits"])
        failing = f" (failing: {', '.join(st['failures'])})" if st["failures"] else ""
        return f"{said}{failing}"

    def steps_series(self, steps: list[dict], gate: dict) -> Series:
        first = gate["limits"][0] if gate["limits"] else None
        if first is None:
            return Series([0.0 for _ in steps], 0.0, "", "no limit")
        values = [next((c["value"] for c in s["limits"] if c["number"] == first["number"]), None) for s in steps]
        return Series([float("nan") if v is None else v for v in values], first["limit"], first["number"],
                      f"{first['number']} ({gate['task']})")

    def steps_table(self, steps: list[dict]) -> tuple[list[str], list[list]]:
        names = [c["number"] for c in steps[0]["limits"]] if steps else []
        return (["step", "layers in float16", "INT8 ops", *names, "failing", "passed"],
                [[i, in_float(s), s["int8_ops"], *[_num(c["value"]) for c in s["limits"]],
                  ", ".join(s.get("failures", [])), s["passed"]] for i, s in enumerate(steps)])

    def table(self, r: dict) -> list[str]:
        lines = [f"  task metric {r['task']} on the FP32 and INT8 outputs of each image"]
        limited = {c["number"]: c for c in r["limits"]}
        for k, v in r["numbers"].items():
            c = limited.get(k)
            lines.append(f"  {k:<24} {_num(v):>14}" + (f"  (needs {_need(c)}){'' if c['passed'] else '  FAIL'}"
                                                       if c else ""))
        return lines + ["  outputs and parts, INT8 against FP32:"] + rows_text(r["outputs"])

    def verdict(self, r: dict) -> str:
        said = ", ".join(f"{c['number']} {_num(c['value'])} (needs {_need(c)})" for c in r["limits"])
        failing = f"; failing: {', '.join(r['failures'])}" if r["failures"] else ""
        return f"{r['task']}: {said}{failing}"

    def failure(self, r: dict) -> str | None:
        if not r["failures"]:
            return explain(r, None)
        said = [f"{c['number']} {_num(c['value'])} does not meet evaluation.{c['kind']}.{c['number']} {c['limit']:g}"
                if c["value"] is not None else
                f"{c['number']} was not measured (the metric returned no value), so evaluation.{c['kind']}."
                f"{c['number']} {c['limit']:g} is not met" for c in r["limits"] if not c["passed"]]
        parts = [f for f in r["failures"] if f not in {c["number"] for c in r["limits"]}]
        if parts:
            said.append(failure_text(r["outputs"], parts))
        others = ", ".join(f"{k} {_num(v)}" for k, v in r["numbers"].items()
                           if k not in {c["number"] for c in r["limits"]})
        return explain(r, f"task metric {r['task']} on INT8 against FP32: " + "; ".join(said)
                       + (f" (its other numbers: {others})" if others else ""))

    def summary_rows(self, r: dict) -> list[list]:
        limited = {c["number"]: c for c in r["limits"]}
        return [["task metric", r["task"]]] + [
            [k, _num(v) + (f" (needs {_need(limited[k])})" if k in limited else "")] for k, v in r["numbers"].items()]

    def details(self, r: dict) -> tuple[str, str, list[str], list[list]]:
        return ("per-output", "Outputs and parts (cosine, SQNR)", *rows_details(r["outputs"]))
