"""model.onnx through the whole build graph: the demo's FP32 ONNX (the graph.onnx quantflow wrote for it)
builds like the MindSpore network it came from, with the same INT8 parameters and the same gate result.

The ONNX project is a fresh folder holding only quantflow.toml, the ONNX file and the images (no dodo.py):
it builds with the installed ``quantflow build``."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import run_quantflow, task_lines


def _latest(project: Path) -> dict:
    return json.loads((project / "build" / "latest.json").read_text())


def _onnx_config(demo: Path, onnx_name: str) -> str:
    """The demo's configuration with model.onnx instead of entry + checkpoint and no [train] section."""
    text = (demo / "quantflow.toml").read_text()
    text = re.sub(r'entry = "quantflow.demo.net:build"\ncheckpoint = "[^"]+"', f'onnx = "{onnx_name}"', text)
    return text.split("[train]")[0]


@pytest.fixture(scope="module")
def onnx_build(built_demo, tmp_path_factory):
    demo, _ = built_demo
    project = tmp_path_factory.mktemp("onnx_project")
    for folder in ("calib_data", "eval_data"):
        shutil.copytree(demo / folder, project / folder)
    model = onnx.load(str(Path(_latest(demo)["artifacts"]["graph"]) / "graph.onnx"))
    # as an exporter writes it: a dynamic batch (model.input_shape fixes it)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(model, project / "digits.onnx")
    (project / "quantflow.toml").write_text(_onnx_config(demo, "digits.onnx"))
    assert sorted(p.name for p in project.iterdir()) == ["calib_data", "digits.onnx", "eval_data", "quantflow.toml"]
    proc = run_quantflow(project, "build")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return demo, project, proc


def test_an_onnx_model_builds_every_stage(onnx_build):
    _, project, proc = onnx_build
    status = task_lines(proc.stdout)
    assert all(status[t] == "ran" for t in ("graph", "calibrate", "fallback", "export", "aipp", "atc", "gate"))
    assert "matches onnxruntime" in proc.stdout
    dirs = {k: Path(v) for k, v in _latest(project)["artifacts"].items()}
    graph = json.loads((dirs["graph"] / "graph.json").read_text())
    assert graph["source"].startswith("model.onnx ") and graph["verify"]["relative_diff"] < 1e-5
    for name in ("model.onnx", "graph.onnx", "deploy.onnx", "deploy.mindir", "record.txt"):
        assert (dirs["export"] / name).is_file(), name
    assert not (dirs["export"] / "model.mindir").exists()


def test_same_int8_parameters_and_gate_result_as_the_mindspore_network(onnx_build):
    demo, project, _ = onnx_build
    ms_dirs = {k: Path(v) for k, v in _latest(demo)["artifacts"].items()}
    onnx_dirs = {k: Path(v) for k, v in _latest(project)["artifacts"].items()}
    ms_q = json.loads((ms_dirs["fallback"] / "qparams.json").read_text())
    onnx_q = json.loads((onnx_dirs["fallback"] / "qparams.json").read_text())
    assert len(ms_q["ops"]) == len(onnx_q["ops"]) == 4
    for a, b in zip(ms_q["ops"], onnx_q["ops"]):
        assert a["op"] == b["op"] and a["scale_d"] == b["scale_d"] and a["offset_d"] == b["offset_d"]
    ms_w, onnx_w = np.load(ms_dirs["fallback"] / "qparams.npz"), np.load(onnx_dirs["fallback"] / "qparams.npz")
    assert sorted(ms_w.files) == sorted(onnx_w.files)
    for k in ms_w.files:  # a MatMul weight may be stored transposed (as Gemm's B, not nn.Dense's weight)
        a, b = ms_w[k], onnx_w[k]
        np.testing.assert_array_equal(a if a.shape == b.shape else a.T, b)
    ms_r = json.loads((ms_dirs["gate"] / "accuracy_report.json").read_text())
    onnx_r = json.loads((onnx_dirs["gate"] / "accuracy_report.json").read_text())
    for key in ("fp32_top1", "int8_top1", "images", "passed"):
        assert ms_r[key] == onnx_r[key], key


def test_report_and_list_show_the_last_build(onnx_build):
    _, project, _ = onnx_build
    latest = _latest(project)
    rep = run_quantflow(project, "report")
    assert rep.returncode == 0, rep.stderr
    assert Path(latest["accuracy_report"]).read_text() in rep.stdout
    assert f"gate: {'PASS' if latest['gate']['passed'] else 'FAIL'}" in rep.stdout
    listed = run_quantflow(project, "list")
    rows = {line.split()[0]: line for line in listed.stdout.splitlines() if line and not line.startswith("(")}
    assert list(rows) == ["preflight", "train", "sample", "graph", "calibrate", "aipp", "fallback", "export", "atc",
                          "gate", "summary"]
    assert latest["artifacts"]["gate"] in rows["gate"]


def test_two_configs_build_in_parallel_each_in_its_own_output_dir(onnx_build):
    _, project, _ = onnx_build
    text = (project / "quantflow.toml").read_text()
    for name in ("a", "b"):
        (project / f"{name}.toml").write_text(text.replace('output_dir = "build"', f'output_dir = "build_{name}"')
                                              .replace("threshold = 0.01", f"threshold = 0.0{2 if name == 'b' else 1}"))
    proc = run_quantflow(project, "build", "a.toml", "b.toml", "-j", "2")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "===== a.toml: built" in proc.stdout and "===== b.toml: built" in proc.stdout
    a = json.loads((project / "build_a" / "latest.json").read_text())
    b = json.loads((project / "build_b" / "latest.json").read_text())
    assert a["gate"]["threshold"] == 0.01 and b["gate"]["threshold"] == 0.02
    assert all(Path(p).is_relative_to(project / "build_a") for p in a["artifacts"].values())
    assert all(Path(p).is_relative_to(project / "build_b") for p in b["artifacts"].values())
    assert (project / "build_a" / ".doit.sqlite").is_file() and (project / "build_b" / ".doit.sqlite").is_file()
    # the same calibration in both: identical INT8 parameters, written twice, apart
    assert (Path(a["qparams"]).read_bytes() == Path(b["qparams"]).read_bytes()) and a["qparams"] != b["qparams"]


def test_two_configs_with_one_output_dir_are_refused_by_name(onnx_build):
    _, project, _ = onnx_build
    (project / "c.toml").write_text((project / "quantflow.toml").read_text())
    proc = run_quantflow(project, "build", "quantflow.toml", "c.toml", "-j", "2")
    assert proc.returncode == 2
    assert "quantflow.toml and c.toml both build into" in proc.stderr and "build.output_dir" in proc.stderr
