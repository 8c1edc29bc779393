"""mindcv model-zoo networks and mindyolo's YOLOv8-n (random weights) through the whole build graph, read from
model.mindir, built with `quantflow build` in a folder holding only the project (no dodo.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.project import REPO, run_quantflow, task_lines

pytest.importorskip("mindcv")


@pytest.mark.parametrize("arch,expect", [
    ("resnet18", {"InplaceAddExt", "MaxPool", "Conv2D"}),
    ("mobilenet_v3_small_100", {"HSwish", "HSigmoid", "Mul", "Conv2D"}),
])
def test_zoo_network_builds_with_quantflow_build(tmp_path, arch, expect):
    from benchmarks.zoo import build_project

    toml = build_project(arch, tmp_path / arch, size=64, calib_per_class=2, eval_per_class=2, verify_images=2,
                         data_root=REPO)
    proc = run_quantflow(tmp_path / arch, "build", str(toml))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    status = task_lines(proc.stdout)
    assert all(status[t] == "ran" for t in ("graph", "calibrate", "gate", "summary"))
    latest = json.loads((tmp_path / arch / "build" / "latest.json").read_text())
    dirs = {k: Path(v) for k, v in latest["artifacts"].items()}
    graph = json.loads((dirs["graph"] / "graph.json").read_text())
    assert expect <= set(graph["ops"]) and graph["verify"]["relative_diff"] < 1e-4
    qparams = json.loads((dirs["calibrate"] / "qparams.json").read_text())
    assert len(qparams["ops"]) == graph["ops"]["Conv2D"] + graph["ops"].get("MatMul", 0)
    report = json.loads((dirs["gate"] / "accuracy_report.json").read_text())
    assert report["images"] == 20 and report["relative_logit_error"] < 0.2
    assert "SKIPPED atc conversion" in proc.stdout


@pytest.mark.parametrize("arch,convs,expect,shapes", [
    ("yolov5n", 60, {"SiLU", "Sigmoid", "Pow", "TensorScatterUpdate", "Concat", "MaxPool"},
     [[1, 1575, 15], [1, 3, 20, 20, 15], [1, 3, 10, 10, 15], [1, 3, 5, 5, 15]]),
    ("yolov8n", 64, {"SiLU", "Softmax", "Sigmoid", "Split", "Concat", "MaxPool"},
     [[1, 525, 14], [1, 74, 20, 20], [1, 74, 10, 10], [1, 74, 5, 5]]),
])
def test_mindyolo_detector_builds_gated_on_every_output(tmp_path, arch, convs, expect, shapes):
    """Real YOLOs from MindSpore's model family: mindyolo's YOLOv5-n (C3, SPPF, anchor-based head decoding by
    slice assignment) and YOLOv8-n (C2f, SPPF, the anchor-free head with DFL boxes) build with the outputs
    gate: the decoded predictions and the three raw head maps.  Their anchor grids are computed when read."""
    pytest.importorskip("mindyolo")
    from benchmarks.zoo import build_project

    toml = build_project(arch, tmp_path / arch, calib_per_class=2, eval_per_class=2, verify_images=2, data_root=REPO)
    assert 'metric = "outputs"' in toml.read_text() and "num_classes" not in toml.read_text()
    proc = run_quantflow(tmp_path / arch, "build", str(toml))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    latest = json.loads((tmp_path / arch / "build" / "latest.json").read_text())
    dirs = {k: Path(v) for k, v in latest["artifacts"].items()}
    graph = json.loads((dirs["graph"] / "graph.json").read_text())
    ops = graph["ops"]
    assert ops["Conv2D"] == convs and expect <= set(ops) and not {"Tile", "Stack"} & set(ops)
    assert graph["verify"]["relative_diff"] < 1e-4
    qparams = json.loads((dirs["calibrate"] / "qparams.json").read_text())
    assert len(qparams["ops"]) == convs
    report = json.loads((dirs["gate"] / "accuracy_report.json").read_text())
    assert report["metric"] == "outputs" and report["passed"] and report["images"] == 20
    assert [o["shape"] for o in report["outputs"]] == shapes
    assert all(0.9 <= o["cosine"] < 1 and o["sqnr_db"] > 20 for o in report["outputs"])
