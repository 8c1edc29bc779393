"""What the converter benchmarks (``tflite_models``, ``paddle_models``) do as a new user does it, once: ``quantflow
init`` on the converted file and the image folders, then ``quantflow build``, each step's outcome recorded in the
case's row (a refusal is a result: its message is kept and the case stops), and the row's cells for the tables."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

TAIL = 12   # lines of a refused init's or a stopped build's output kept


def quantflow_cmd() -> list[str]:
    script = Path(sys.executable).parent / "quantflow"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "quantflow.cli"]


def head_comment(toml: Path) -> str:
    """The comment quantflow init writes above ``evaluation.metric`` (what it recognised), as one line."""
    text = toml.read_text()
    section = text[text.find("[evaluation]"):]
    lines = []
    for ln in section.splitlines()[1:]:
        if not ln.startswith("#"):
            break
        lines.append(ln.lstrip("# ").rstrip())
    return " ".join(lines)


def init(folder: Path, onnx_name: str, calib: Path, evals: Path, row: dict, label: str) -> bool:
    """``quantflow init --onnx onnx_name`` in ``folder`` on copies of ``calib`` and ``evals``; its exit and output
    in ``row["init"]``; False (``row["stopped"]`` said) where it refused.  ``label`` starts the progress line."""
    shutil.copytree(calib, folder / "calib")
    shutil.copytree(evals, folder / "eval")
    r = subprocess.run([*quantflow_cmd(), "init", "--onnx", onnx_name, "--calib", "calib", "--eval", "eval"],
                       cwd=folder, capture_output=True, text=True)
    row["init"] = {"exit": r.returncode, "output": (r.stdout + r.stderr).strip().splitlines()}
    print(f"{label}quantflow init exit {r.returncode}", flush=True)
    if r.returncode:
        row["stopped"] = {"at": "quantflow init", "message": row["init"]["output"][-TAIL:]}
        return False
    return True


def build(folder: Path, row: dict, label: str) -> None:
    """``nice -n 10 quantflow build`` in ``folder`` (its log in ``build.log``): its exit and wall time in
    ``row["build"]``; the gate's report (verdict, figures, the float16 floor) in ``row["report"]`` and its
    "INT8 changes ..." line in ``row["floor_line"]``, or ``row["stopped"]`` where no gate report was written."""
    log = folder / "build.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        b = subprocess.run(["nice", "-n", "10", *quantflow_cmd(), "build"], cwd=folder, stdout=f,
                           stderr=subprocess.STDOUT)
    row["build"] = {"exit": b.returncode, "seconds": time.perf_counter() - t0, "log": str(log)}
    print(f"{label}quantflow build exit {b.returncode} in {row['build']['seconds']:.0f} s", flush=True)
    reports = sorted((folder / "build").glob("artifacts/gate/*/accuracy_report.json"), key=lambda p: p.stat().st_mtime)
    if not reports:
        row["stopped"] = {"at": "quantflow build", "message": log.read_text().strip().splitlines()[-TAIL:]}
        return
    rep = json.loads(reports[-1].read_text())
    txt = reports[-1].with_suffix(".txt").read_text().splitlines()
    row["report"] = {k: rep.get(k) for k in ("verdict", "passed", "figures", "distance", "float16", "quantized_ops",
                                             "images", "numbers")}
    row["report"]["path"] = str(reports[-1])
    row["floor_line"] = next((ln.strip() for ln in txt if ln.strip().startswith("INT8 changes")), "")


def fig(f: dict) -> str:
    """A gated figure in one cell: its label, value, interval, limit and verdict."""
    side = ">=" if f.get("kind") == "min" else "<="
    iv = f" [{f['low']:.4g}, {f['high']:.4g}]" if f.get("low") is not None else ""
    return f"{f.get('label') or f.get('id')} {f['value']:.4g}{iv} ({side} {f['limit']:g}): {f['verdict']}"


def verdict_cell(r: dict) -> tuple[str, str, str]:
    """(verdict with the gated figures, the float16 floor line, the build's seconds) of a row, or where it stopped
    and why."""
    if r.get("stopped"):
        msg = " / ".join(r["stopped"]["message"][-2:]).replace("|", "\\|")
        secs = f"{r['build']['seconds']:.0f}" if r.get("build") else "-"
        return f"stopped at {r['stopped']['at']}: {msg}", "-", secs
    rep = r["report"]
    gated = [f for f in rep["figures"] or [] if f.get("gated", True)]
    verdict = f"**{rep['verdict']}** (exit {r['build']['exit']}): " + "; ".join(fig(f) for f in gated)
    return verdict, r["floor_line"].replace("|", "\\|"), f"{r['build']['seconds']:.0f}"
