"""Projects the end-to-end tests build: a copy of the shipped demo, its environment (no CANN, quantflow from this
tree), and the commands that build it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the demo project: its configuration, the shipped checkpoints with their training records (so that its build
# trains nothing) and its images
PROJECT_FILES = ["dodo.py", "quantflow.toml", "quantflow/demo/checkpoints", "calib_data", "eval_data"]


def copy_project(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def clean_env(**extra) -> dict:
    """The environment of the builds the tests start: no CANN toolkit, and quantflow imported from this tree
    (whatever checkout an editable install points at)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


def run_doit(project: Path, *args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "doit", *args], cwd=project, env=env or clean_env(),
                          capture_output=True, text=True, timeout=timeout)


def run_quantflow(project: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """The installed command (``python -m quantflow.cli`` is what the ``quantflow`` script runs)."""
    return subprocess.run([sys.executable, "-m", "quantflow.cli", *args], cwd=project, env=clean_env(),
                          capture_output=True, text=True, timeout=timeout)


def onnx_config(demo: Path, onnx_name: str) -> str:
    """The demo's configuration (in folder ``demo``) with model.onnx instead of entry + checkpoint and no [train]
    section."""
    text = (demo / "quantflow.toml").read_text()
    text = re.sub(r'entry = "quantflow.demo.net:build"\ncheckpoint = "[^"]+"', f'onnx = "{onnx_name}"', text)
    return text.split("[train]")[0]


def task_lines(output: str) -> dict[str, str]:
    """doit's per-task status lines: {'train': 'ran' | 'up-to-date' | 'ignored'}.  Found at the end of a line,
    not only at its start: under ``doit -n 2`` a stage's own output, written by another process, can hold part of
    a line when doit's reporter prints its marker."""
    kinds = {".  ": "ran", "-- ": "up-to-date", "!! ": "ignored"}
    status = {}
    from quantflow.tasks import STAGES

    for m in re.finditer(r"(\.  |-- |!! )([A-Za-z0-9_:-]+)[ \t]*$", output, re.M):
        if m.group(2) in STAGES:
            status[m.group(2)] = kinds[m.group(1)]
    return status
