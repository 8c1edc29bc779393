"""The protocol every accuracy-gate metric (``evaluation.metric``) follows.

A metric says what its report holds and when it passes (``evaluate``), gives the automatic fallback its check
(``checker``: a report for any INT8 parameters) and what a failed check points at (``focus``: the network
outputs the next layer is ranked on), and how its report reads: a one-line verdict, the reason it failed, the
rows and table of the build report and the console, and each fallback step's line, table and chart series.
The stages, the build summary, ``quantflow report`` and the HTML report (``quantflow.report``) ask the metric
instead of reading one metric's fields.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol


@dataclass(frozen=True)
class Series:
    """A value per fallback step, for the report's chart: against the gate's ``limit`` and, when given, the
    FP32 ``reference``."""
    values: list[float]
    limit: float
    ylabel: str
    label: str
    reference: float | None = None
    reference_label: str = ""


class Metric(Protocol):
    name: str
    summary_keys: tuple[str, ...]   # the report's fields the build summary (latest.json) carries
    step_keys: tuple[str, ...]      # the check's fields each fallback step records

    def evaluate(self, ev, limits, graph, folded, qparams, aipp_params: dict, names: dict | None = None) -> dict:
        """The report on the held-out set ``ev`` (``runs.HeldOut``) against ``limits`` (the [evaluation]
        settings), at least ``images`` and ``passed``; ``names``: the model file's names of the graph's outputs
        (``runs.output_names``), which the report, ``evaluation.parts`` and task metrics use."""

    def checker(self, ev, limits, graph, folded, aipp_params: dict, names: dict | None = None) -> Callable:
        """``check(qparams) -> report`` for the automatic fallback (what does not change computed once; a
        setting that does not fit the network fails here, before any run)."""

    def focus(self, report: dict) -> list[str] | None: ...
    def verdict(self, report: dict) -> str: ...
    def failure(self, report: dict) -> str | None: ...
    def summary_rows(self, report: dict) -> list[list]: ...
    def details(self, report: dict) -> tuple[str, str, list[str], list[list]]: ...
    def table(self, report: dict) -> list[str]: ...
    def step_line(self, step: dict) -> str: ...
    def steps_table(self, steps: list[dict]) -> tuple[list[str], list[list]]: ...
    def steps_series(self, steps: list[dict], report: dict) -> Series: ...


def in_float(step: dict) -> str:
    """The layers a fallback step left in float16."""
    return ", ".join(f["scope"] for f in step["float_ops"]) or "(none)"
