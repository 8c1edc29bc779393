"""The second shipped demo: a residual MobileNetV2-style network (its shipped checkpoint), quantized and gated by
doit."""
import json
import shutil
from pathlib import Path

from support.project import REPO, copy_project, run_doit, task_lines
from test_deploy import check_built_deploy


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
    qparams = json.loads((dirs["fallback"] / "qparams.json").read_text())["ops"]
    depthwise = [q for q in qparams if q["op"] == "Conv2D" and q["weight_shape"][1] == 1]
    assert len(depthwise) == 5 and len(qparams) == 18
    for name in ("deploy.onnx", "deploy.mindir", "deploy_net.py", "record.txt", "graph.onnx"):
        assert (dirs["export"] / name).is_file(), name
    assert json.loads((dirs["export"] / "export.json").read_text())["int8_ops"] == 18
    assert check_built_deploy(latest, project / "eval_data") == 10
    metrics = json.loads((project / "quantflow" / "demo" / "checkpoints" / "digits_mbv2.train.json").read_text())["metrics"]
    gate = latest["gate"]
    assert gate["passed"] and gate["fp32_top1"] == metrics["heldout_top1"] >= 0.97  # the stated accuracy
    assert gate["fp32_top1"] - gate["int8_top1"] <= 0.01
