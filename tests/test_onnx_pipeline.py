"""model.onnx through the whole build graph: the demo's FP32 ONNX (the graph.onnx quantflow wrote for it)
builds like the MindSpore network it came from, with the same INT8 parameters and the same gate result.

The ONNX project is a fresh folder holding only quantflow.toml, the ONNX file and the images (no dodo.py):
it builds with the installed ``quantflow build`` (its other commands: tests/test_cli.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from support.project import onnx_config, run_quantflow, task_lines


def _latest(project: Path) -> dict:
    return json.loads((project / "build" / "latest.json").read_text())


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
    (project / "quantflow.toml").write_text(onnx_config(demo, "digits.onnx"))
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
    assert len(ms_q["ops"]) == len(onnx_q["ops"]) == 5
    for a, b in zip(ms_q["ops"], onnx_q["ops"]):
        assert a["op"] == b["op"] and a["device_precision"] == b["device_precision"] and a["reason"] == b["reason"]
        assert a.get("scale_d") == b.get("scale_d") and a.get("offset_d") == b.get("offset_d")
    # the stem reads 3 channels (float16 on the device); the convolutions after it and the Dense layers are INT8
    assert [a["device_precision"] for a in ms_q["ops"]] == ["float16", "int8", "int8", "int8", "int8"]
    ms_w, onnx_w = np.load(ms_dirs["fallback"] / "qparams.npz"), np.load(onnx_dirs["fallback"] / "qparams.npz")
    assert sorted(ms_w.files) == sorted(onnx_w.files)
    for k in ms_w.files:  # a MatMul weight may be stored transposed (as Gemm's B, not nn.Dense's weight)
        a, b = ms_w[k], onnx_w[k]
        np.testing.assert_array_equal(a if a.shape == b.shape else a.T, b)
    ms_r = json.loads((ms_dirs["gate"] / "accuracy_report.json").read_text())
    onnx_r = json.loads((onnx_dirs["gate"] / "accuracy_report.json").read_text())
    for key in ("fp32_top1", "int8_top1", "images", "passed"):
        assert ms_r[key] == onnx_r[key], key
