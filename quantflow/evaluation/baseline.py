"""A baseline: a previous build's accuracy report the gate compares this build's INT8 with (``evaluation.baseline``,
``quantflow build --baseline PATH``; docs/release-gate.md).

- ``locate``: the report of a path: an ``accuracy_report.json``, the gate's stage folder, a build's output folder
  (through its ``latest.json``) or a project folder holding ``quantflow.toml``'s default ``build/``;
- ``load``: the report and its figures' bootstrap draws (``accuracy_draws.npz`` beside it, when there);
- ``same_images``: the held-out images must be the same (by content hash); a different set is a DataError
  naming what differs;
- ``compare``: each gated figure against the baseline's.  The test: with both builds' draws at hand and the same
  images in the same order and the same bootstrap settings, the draws of both were taken over the same images
  draw by draw, so their difference is the paired bootstrap of the difference (its percentile interval at the
  gate's confidence); the figure is WORSE when that whole interval is on the worse side of zero.  Without paired
  draws (another seed or resample count, an older baseline without its .npz): WORSE when the baseline's figure
  lies beyond this build's interval on the better side.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import ConfigError, DataError
from ..io.files import LATEST_JSON, REPORT_DRAWS, REPORT_JSON
from .intervals import TOLERANCE, interval


def locate(path: Path, field: str = "evaluation.baseline") -> Path:
    """The accuracy_report.json ``path`` names (module docstring); a ConfigError naming ``field`` when none."""
    p = Path(path)
    if p.is_file():
        if p.name == LATEST_JSON:
            return _from_latest(p, field)
        return p
    if p.is_dir():
        for candidate in (p / REPORT_JSON, p / LATEST_JSON, p / "build" / LATEST_JSON):
            if candidate.is_file():
                return candidate if candidate.name == REPORT_JSON else _from_latest(candidate, field)
    raise ConfigError(f"{field}: {p} is neither an {REPORT_JSON}, a gate stage folder holding one, nor a build "
                      f"output folder with a {LATEST_JSON}")


def _from_latest(latest: Path, field: str) -> Path:
    try:
        text = Path(json.loads(latest.read_text())["accuracy_report"])
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{field}: {latest} names no accuracy report (not a quantflow build's {LATEST_JSON})") from None
    found = text.with_name(REPORT_JSON)
    if not found.is_file():
        raise ConfigError(f"{field}: the report {found} that {latest} names is missing")
    return found


def load(path: Path, field: str = "evaluation.baseline") -> tuple[dict, dict | None, Path]:
    """(the report, its figures' draws by id or None, the report's path)."""
    found = locate(path, field)
    try:
        report = json.loads(found.read_text())
    except ValueError as err:
        raise ConfigError(f"{field}: {found} is not valid JSON ({err})") from None
    draws_path = found.with_name(REPORT_DRAWS)
    draws = None
    if draws_path.is_file():
        with np.load(draws_path) as z:
            draws = {k: z[k] for k in z.files}
    return report, draws, found


def same_images(report: dict, base: dict, where: Path) -> None:
    """A DataError unless the gate of ``report`` judged the images (by content) ``base``'s gate judged."""
    if "held_out" not in base or "figures" not in base:
        raise DataError(f"evaluation.baseline {where}: the report has no held-out image hashes and intervals (a build "
                        f"from before release gates); rebuild the baseline with this quantflow")
    mine = dict(zip(report["held_out"]["sha256"], report["held_out"]["images"]))
    theirs = dict(zip(base["held_out"]["sha256"], base["held_out"]["images"]))
    only_mine, only_theirs = sorted(mine.keys() - theirs.keys()), sorted(theirs.keys() - mine.keys())
    if only_mine or only_theirs:
        said = []
        if only_theirs:
            said.append(f"{len(only_theirs)} only in the baseline (e.g. {theirs[only_theirs[0]]})")
        if only_mine:
            said.append(f"{len(only_mine)} only in this build (e.g. {mine[only_mine[0]]})")
        raise DataError(f"evaluation.baseline {where}: its gate judged {len(theirs)} held-out images, this build's "
                        f"{len(mine)}, and they differ by content: {'; '.join(said)}. A comparison needs the same "
                        f"held-out images (the same evaluation.data_dir and, where the fallback tunes on a part of it "
                        f"(tune_from = \"held_out\"), the same tune_share and seed)")


def compare(report: dict, draws: dict, base: dict, base_draws: dict | None, where: Path) -> dict:
    """``report`` with each gated figure's ``baseline`` comparison (module docstring) and ``baseline`` (the path,
    whether the draws were paired); ``verdicts.rejudge`` then counts a WORSE figure as a failure."""
    if base.get("metric") != report.get("metric"):
        raise ConfigError(f"evaluation.baseline {where}: its gate used evaluation.metric {base.get('metric')!r}, this "
                          f"build's {report.get('metric')!r}; compare builds of the same metric")
    same_images(report, base, where)
    paired = (base_draws is not None and base.get("bootstrap") == report["bootstrap"]
              and base["held_out"]["sha256"] == report["held_out"]["sha256"])
    theirs = {f["id"]: f for f in base["figures"]}
    conf = report["bootstrap"]["confidence"]
    for f in report["figures"]:
        b = theirs.get(f["id"])
        if b is None or b["value"] is None or f["value"] is None:
            f["baseline"] = {"value": None if b is None else b["value"], "worse": False,
                             "method": "not in the baseline" if b is None else "not measured"}
            continue
        sign = 1.0 if f["kind"] == "min" else -1.0
        entry = {"value": b["value"], "delta": sign * (f["value"] - b["value"])}
        if paired and f["id"] in draws and f["id"] in base_draws:
            iv = interval(sign * (np.asarray(draws[f["id"]]) - np.asarray(base_draws[f["id"]])), conf)
            entry.update(low=iv[0] if iv else None, high=iv[1] if iv else None, method="paired bootstrap",
                         worse=bool(iv is not None and iv[1] < -TOLERANCE))
        elif f["low"] is not None:
            worse = f["high"] < b["value"] - TOLERANCE if f["kind"] == "min" else f["low"] > b["value"] + TOLERANCE
            entry.update(method="baseline's figure against this build's interval", worse=bool(worse))
        else:
            entry.update(method="no interval", worse=bool(entry["delta"] < -TOLERANCE))
        f["baseline"] = entry
    report["baseline"] = {"path": str(where), "paired": paired}
    return report

