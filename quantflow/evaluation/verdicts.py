"""A metric's report with its gated figures' intervals and verdicts (``intervals``), the same for every metric.

``attach`` puts into a report: ``figures`` (each gated figure: value, interval, limit, verdict, the images that
would decide an UNDECIDED one), ``verdict`` (PASS, FAIL or UNDECIDED over all figures), ``passed`` (the verdict
as ``evaluation.on_undecided`` reads it), ``failures`` / ``undecided`` (the labels of the figures that FAIL /
are UNDECIDED: what the fallback's ranking and the messages point at), ``bootstrap`` (confidence, resamples,
seed) and ``_draws`` (each figure's bootstrap draws by id: kept out of the JSON report, written beside it so that
a later build can pair with them, ``baseline``).  ``with_intervals`` adds the cosine and SQNR intervals to the
outputs' and parts' rows (every metric reports them: fidelity beside the task figure).
"""
from __future__ import annotations

import numpy as np

from .intervals import (FAIL, PASS, UNDECIDED, Resampling, figure, interval, line, overall, passes,
                        region_replicates)
from .parts import label

DRAWS = "_draws"   # the report's in-memory key of the figures' bootstrap draws (never written to JSON)


def with_intervals(rows: list[dict], stats: np.ndarray, r: Resampling) -> list[dict]:
    """``outputs.region_rows``' rows (one per region of ``stats``, in order) with ``cosine_interval`` and
    ``sqnr_db_interval``."""
    cos, sqnr = region_replicates(r, stats)
    out = []
    for k, row in enumerate(rows):
        out.append(dict(row, cosine_interval=interval(cos[:, k], r.confidence),
                        sqnr_db_interval=interval(sqnr[:, k], r.confidence)))
    return out


def region_figures(rows: list[dict], stats: np.ndarray, r: Resampling) -> tuple[list[dict], dict]:
    """(a figure per limit of every gated row -- its cosine, its SQNR --, their draws by id); a row that is
    shown only (``passed`` None: a whole output judged by its parts, a part with ``gate = false``) has none."""

    cos, sqnr = region_replicates(r, stats)
    figures, draws = [], {}
    n = len(stats)
    for k, row in enumerate(rows):
        if row.get("passed") is None:
            continue
        name = label(row)
        for key, limit, rep, what in (("cosine", row.get("min_cosine"), cos[:, k], "cosine"),
                                      ("sqnr_db", row.get("min_sqnr_db"), sqnr[:, k], "SQNR dB")):
            if limit is None:
                continue
            fid = f"{name} {what}"
            draws[fid] = rep
            figures.append(figure(fid, name, fid, row[key], limit, "min", rep, n, r.confidence))
    return figures, draws


def mark_rows(rows: list[dict], figures: list[dict]) -> list[dict]:
    """Each gated row's ``verdict`` (the worst of its figures) and ``passed`` (no figure of it FAILs)."""
    out = []
    for row in rows:
        if row.get("passed") is None:
            out.append(row)
            continue
        mine = [f["verdict"] for f in figures if f["label"] == label(row)]
        v = FAIL if FAIL in mine else UNDECIDED if UNDECIDED in mine else PASS
        out.append(dict(row, verdict=v, passed=v != FAIL))
    return out


def attach(report: dict, figures: list[dict], draws: dict, r: Resampling, limits, **extra) -> dict:
    """``report`` with the figures, the verdicts and the draws (module docstring); ``extra`` updates it too."""
    report.update(extra, figures=figures, bootstrap=r.settings(), on_undecided=limits.on_undecided)
    report[DRAWS] = draws
    return rejudge(report)


def rejudge(report: dict) -> dict:
    """``verdict``, ``passed``, ``failures`` and ``undecided`` from the report's figures (again, once a baseline
    has been compared)."""
    figures = report["figures"]
    v = overall(figures)
    labels = lambda keep: list(dict.fromkeys(f["label"] for f in figures if keep(f)))  # noqa: E731
    report.update(verdict=v, passed=passes(v, report["on_undecided"]), failures=labels(lambda f: f["verdict"] == FAIL),
                  undecided=labels(lambda f: f["verdict"] == UNDECIDED),
                  worse=labels(lambda f: f.get("baseline", {}).get("worse")))
    return report


def explain(report: dict, own: str | None) -> str | None:
    """Why the build fails: the metric's own text for the figures that FAIL (``own``), the figures worse than
    the baseline, and the UNDECIDED ones when ``evaluation.on_undecided = "fail"``; None when it passes."""
    if "figures" not in report:
        return own
    said = [own] if own else []
    figures = report["figures"]
    worse = [f for f in figures if f.get("baseline", {}).get("worse")]
    if worse:
        said.append("worse than the baseline " + str(report.get("baseline", {}).get("path", "")) + ": "
                    + "; ".join(line(f) for f in worse))
    undecided = [f for f in figures if f["verdict"] == UNDECIDED]
    if undecided and report["on_undecided"] == "fail" and report["verdict"] == UNDECIDED:
        said.append('UNDECIDED, which evaluation.on_undecided = "fail" fails: ' + "; ".join(line(f) for f in undecided))
    return "; ".join(said) or None
