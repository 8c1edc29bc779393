"""The second shipped demo: a residual MobileNetV2-style network (its shipped checkpoint), quantized and gated by
doit."""
import json
import shutil
from pathlib import Path

import onnx
from support import conformance
from support.project import REPO, copy_project, run_doit, task_lines
from test_deploy import check_built_deploy

from quantflow.frontends.mindir import read_mindir


def test_mobilenet_demo_passes_the_gate(tmp_path):
    project = copy_project(tmp_path / "p")
    example = project / "examples" / "mobilenet_v2"
    example.mkdir(parents=True)
    shutil.copy2(REPO / "examples" / "mobilenet_v2" / "quantflow.toml", example / "quantflow.toml")
    proc = run_doit(project, "config=examples/mobilenet_v2/quantflow.toml")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert task_lines(proc.stdout)["train"] == "up-to-date"  # the shipped checkpoint, as its record says
    latest = json.loads((example / "build" / "latest.json").read_text())
    dirs = {k: Path(v) for k, v in latest["artifacts"].items()}
    graph = json.loads((dirs["graph"] / "graph.json").read_text())
    assert graph["ops"]["Add"] == 3 and graph["ops"]["ReLU6"] >= 10  # residual adds, ReLU6 activations
    assert graph["float16_assumed_ops"] == ["ReduceMean"]  # the global average pool
    meta = json.loads((dirs["fallback"] / "qparams.json").read_text())
    int8 = [q for q in meta["ops"] if q["device_precision"] == "int8"]
    depthwise = [q for q in int8 if q["op"] == "Conv2D" and q["weight_shape"][1] == 1]
    # the stem (3 channels) and the first two blocks' expansions (16 channels) are float16 on the device
    assert len(depthwise) == 5 and len(int8) == 15 and len(meta["ops"]) == 18
    for name in ("deploy.onnx", "deploy.mindir", "deploy_net.py", "record.txt", "graph.onnx"):
        assert (dirs["export"] / name).is_file(), name
    assert json.loads((dirs["export"] / "export.json").read_text())["int8_ops"] == 15
    # the second demo's deploy graphs follow CANN's rules too
    assert conformance.check_deploy_onnx(onnx.load(str(dirs["export"] / "deploy.onnx"))) == 15
    assert conformance.check_deploy_mindir(read_mindir(dirs["export"] / "deploy.mindir"),
                                           (dirs["export"] / "deploy_net.py").read_text()) == 15
    conformance.check_record((dirs["export"] / "record.txt").read_text(), onnx.load(str(dirs["graph"] / "graph.onnx")),
                             [q["scope"] for q in int8])
    conformance.check_qparams(meta, 18)
    assert check_built_deploy(latest, project / "eval_data") == 10
    metrics = json.loads((project / "quantflow" / "demo" / "checkpoints" / "digits_mbv2.train.json").read_text())["metrics"]
    gate = latest["gate"]
    assert gate["passed"] and gate["fp32_top1"] == metrics["heldout_top1"] >= 0.97  # the stated accuracy
    assert gate["fp32_top1"] - gate["int8_top1"] <= 0.01
