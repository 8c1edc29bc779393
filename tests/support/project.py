"""Projects the end-to-end tests build: a copy of the shipped demo, its environment (no CANN, quantflow from this
tree), and the commands that build it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

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


# ----------------------------------------------------------------------------- a tiny ONNX project
IMAGES_PER_CLASS = 6


def tiny_onnx(path: Path, classes: int = 10, size: int = 32) -> None:
    """Conv 4x4 stride 4 -> Relu -> Gemm, seeded weights, a dynamic batch as exporters write it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    side = size // 4
    weights = [numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 4, 4)).astype(np.float32), "w1"),
               numpy_helper.from_array(rng.normal(0, 0.3, (classes, 8 * side * side)).astype(np.float32), "w2"),
               numpy_helper.from_array(np.zeros(classes, np.float32), "b2")]
    nodes = [helper.make_node("Conv", ["image", "w1"], ["c"], strides=[4, 4]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                        ["batch", 3, size, size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", classes])], weights)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def tiny_config() -> str:
    """The demo's config for the tiny network (test_cli's project): fewer images, and a gate a random network
    passes (any drop)."""
    text = onnx_config(REPO, "tiny.onnx")
    for old, new in (('input_name = "x"', 'input_name = "image"'), ("count = 200", "count = 60"),
                     ("per_class_min = 15", f"per_class_min = {IMAGES_PER_CLASS}"),
                     ("threshold = 0.01", "threshold = 1.0")):
        assert old in text, old
        text = text.replace(old, new)
    return text


def tiny_project(project: Path, config: str | None = None) -> Path:
    """A folder holding only quantflow.toml (``config``, default ``tiny_config()``), tiny.onnx and
    ``IMAGES_PER_CLASS`` images per class of the shipped demo folders: builds in seconds, nothing to train."""
    project.mkdir(parents=True, exist_ok=True)
    tiny_onnx(project / "tiny.onnx")
    for folder in ("calib_data", "eval_data"):
        for cls in sorted((REPO / folder).iterdir()):
            (project / folder / cls.name).mkdir(parents=True)
            for image in sorted(cls.iterdir())[:IMAGES_PER_CLASS]:
                shutil.copy(image, project / folder / cls.name / image.name)
    (project / "quantflow.toml").write_text(config or tiny_config())
    return project


def init_onnx_project(project: Path, onnx_name: str, save_model) -> Path:
    """``tiny_project``'s images with the ONNX model ``save_model(path)`` writes as ``onnx_name`` and quantflow.toml
    as ``quantflow init`` writes it for them; returns that file."""
    from quantflow.scaffold import write

    tiny_project(project)
    save_model(project / onnx_name)
    (project / "quantflow.toml").unlink()
    out, _ = write(project / "quantflow.toml", calib=project / "calib_data", eval=project / "eval_data",
                   onnx=project / onnx_name)
    return out
