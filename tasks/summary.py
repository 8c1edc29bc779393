"""summary: ``<output_dir>/latest.json`` names the current artifacts (each keyed stage's key and folder, and the
entries each stage's ``summary`` gives: its main files, the gate's verdict), so that it always names the last
build that passed the gate; prints them and the report's path."""
from __future__ import annotations

import json
from pathlib import Path

from quantflow.io.atomic import write_json
from quantflow.io.files import LATEST_JSON

from .stage import Stage

__all__ = ["LATEST_JSON", "STAGE", "latest_path", "read_latest", "summary"]
# the files the console lists, in this order (every entry is in latest.json)
SHOWN = ("qparams", "deploy_onnx", "deploy_mindir", "deploy_air", "record", "mindir", "graph_onnx", "air",
         "aipp_config", "om", "accuracy_report", "junit", "gate_summary", "sensitivity")


def latest_path(cfg) -> Path:
    """``<output_dir>/latest.json`` of configuration ``cfg``."""
    return cfg.out / LATEST_JSON


def read_latest(path: Path) -> dict:
    from quantflow.errors import QuantflowError
    try:
        return json.loads(Path(path).read_text())
    except ValueError as err:
        raise QuantflowError(f"{path} is not valid JSON ({err}); rebuild with `quantflow build`") from None


def summary(b) -> dict:
    """What latest.json holds for the current keys."""
    keyed = [s for s in b.stages() if s.keyed]
    out = {"keys": {s.name: b.key(s.name) for s in keyed}, "artifacts": {s.name: str(b.dir(s.name)) for s in keyed}}
    for s in keyed:
        if s.summary:
            out.update(s.summary(b))
    return out


def _run(b) -> None:
    s = summary(b)
    write_json(latest_path(b.cfg), s)
    print("artifacts: " + ", ".join(f"{stage} {key}" for stage, key in s["keys"].items()))
    for k in SHOWN:
        print(f"  {k:<16} {s[k] or '-'}")
    print(f"  {'atc':<16} {s['atc']}")
    g = s["gate"]
    print(f"  {'gate':<16} {'PASS' if g['passed'] else 'FAIL'}: {g['verdict']}")
    if s["float16_fallback"]:
        print(f"  {'float16 layers':<16} {', '.join(s['float16_fallback'])}")
    print(f"build report: {s['report']}")


def _uptodate(b) -> bool:
    try:
        return json.loads(latest_path(b.cfg).read_text()) == json.loads(json.dumps(summary(b)))
    except (OSError, ValueError, KeyError):
        return False


def _status(b):
    path = latest_path(b.cfg)
    if not path.is_file():
        return "to run", None
    current = {s.name: str(b.dir(s.name, create=False)) for s in b.stages() if s.keyed}
    return ("up to date" if read_latest(path).get("artifacts") == current else "to run"), path


STAGE = Stage(
    name="summary", doc="write <output_dir>/latest.json naming the current artifacts", run=_run,
    needs=("atc", "gate"), keyed=False, uptodate=_uptodate, status=_status)
