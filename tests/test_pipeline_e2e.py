"""The doit graph end to end on the shipped demo (trains the model once per session, about a minute)."""
import json
import re
from pathlib import Path

from conftest import run_doit, task_lines

ALL = ["train", "sample", "graph", "calibrate", "export", "aipp", "atc", "gate", "summary"]
KEYED = ["graph", "calibrate", "export", "aipp", "atc", "gate"]


def latest(project: Path) -> dict:
    return json.loads((project / "build" / "latest.json").read_text())


def test_first_run_executes_every_stage(built_demo):
    project, proc = built_demo
    assert task_lines(proc.stdout) == {t: "ran" for t in ALL}
    out = proc.stdout
    assert "SKIPPED AIR export" in out and "Ascend backend" in out
    assert "exported INT8 deploy graph (4 AscendQuant/AscendDequant pairs)" in out
    assert "IR float output matches MindSpore on 8 calibration images" in out
    assert "SKIPPED atc conversion for Ascend310P3" in out and "no .om was written" in out
    assert not list((project / "build").rglob("*.om"))
    s = latest(project)
    kdir = Path(s["artifacts"])
    for name in ["graph.json", "graph.onnx", "deploy.onnx", "deploy.mindir", "deploy_net.py", "record.txt", "qparams.json", "qparams.npz", "model.mindir", "aipp.cfg",
                 "aipp_check.json", "atc.json", "accuracy_report.json", "accuracy_report.txt", "key_inputs.json"]:
        assert (kdir / name).is_file(), name
    assert s["om"] is None and s["air"] is None and s["atc"].startswith("skipped: ")
    graph = json.loads((kdir / "graph.json").read_text())
    assert graph["ops"]["Conv2D"] == 2 and graph["verify"]["relative_diff"] < 1e-3
    assert graph["float16_assumed_ops"] == []  # BatchNorm folded; the rest is exact in float16
    qparams = json.loads((kdir / "qparams.json").read_text())
    assert [q["op"] for q in qparams["ops"]] == ["Conv2D", "Conv2D", "MatMul", "MatMul"]
    assert s["gate"]["passed"] is True
    assert s["gate"]["fp32_top1"] >= 0.95  # the stated FP32 accuracy of the demo model
    assert s["gate"]["fp32_top1"] - s["gate"]["int8_top1"] <= 0.01
    assert "accuracy gate: PASS" in (kdir / "accuracy_report.txt").read_text()
    metrics = json.loads((project / "build" / "demo" / "digits.metrics.json").read_text())
    assert metrics["heldout_top1"] == s["gate"]["fp32_top1"]
    assert re.fullmatch(r"[0-9a-f]{16}", s["key"]) and kdir.name == s["key"]


def test_second_run_executes_no_task(built_demo):
    project, _ = built_demo
    proc = run_doit(project)
    assert proc.returncode == 0, proc.stderr
    assert task_lines(proc.stdout) == {t: "up-to-date" for t in ALL}


def test_changed_input_gets_a_new_key_and_reverting_finds_the_cache(built_demo):
    project, _ = built_demo
    toml = project / "quantflow.toml"
    original = toml.read_text()
    key_before = latest(project)["key"]
    try:
        toml.write_text(original.replace("threshold = 0.01", "threshold = 0.02"))
        proc = run_doit(project)
        assert proc.returncode == 0, proc.stdout[-3000:]
        status = task_lines(proc.stdout)
        assert status["train"] == status["sample"] == "up-to-date"
        assert all(status[t] == "ran" for t in KEYED + ["summary"])
        assert latest(project)["key"] != key_before
    finally:
        toml.write_text(original)
    proc = run_doit(project)
    assert proc.returncode == 0
    status = task_lines(proc.stdout)
    assert all(status[t] == "up-to-date" for t in ["train", "sample"] + KEYED)
    assert status["summary"] == "ran"  # only latest.json is pointed back at the cached artifacts
    assert latest(project)["key"] == key_before


def test_broken_quantization_fails_the_gate(built_demo):
    project, _ = built_demo
    # clipping every activation at its median destroys the INT8 model
    broken = (project / "quantflow.toml").read_text().replace('method = "kl"', 'method = "percentile"\npercentile = 50.5')
    (project / "broken.toml").write_text(broken)
    proc = run_doit(project, "config=broken.toml")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "accuracy gate: FAIL" in out
    assert "AccuracyGateError" in out and "exceeds evaluation.threshold 1.00" in out
    status = task_lines(proc.stdout)
    assert status["gate"] == "ran" and "summary" not in status
    report = next(p for p in (project / "build" / "artifacts").glob("*/accuracy_report.json")
                  if not json.loads(p.read_text())["passed"])
    assert not (report.parent / ".gate.done").exists()
    # a failed gate is not cached: the next run evaluates (and fails) again
    again = run_doit(project, "config=broken.toml")
    assert again.returncode != 0 and task_lines(again.stdout)["gate"] == "ran"


def test_wrong_normalization_fails_the_aipp_stage(built_demo):
    project, _ = built_demo
    wrong = (project / "quantflow.toml").read_text().replace('scale = "0-1"', 'scale = "0-255"')
    (project / "wrong_norm.toml").write_text(wrong)
    proc = run_doit(project, "config=wrong_norm.toml")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "AippMismatchError" in out and "does not reproduce the training preprocessing" in out
    assert "scale=0-255" in out
    assert "atc" not in task_lines(proc.stdout)  # nothing is converted with a wrong AIPP config


def test_invalid_config_is_reported_by_field(built_demo, tmp_path):
    project, _ = built_demo
    bad = (project / "quantflow.toml").read_text().replace("count = 200", "count = 200\ncont = 3")
    (project / "bad.toml").write_text(bad)
    proc = run_doit(project, "config=bad.toml")
    assert proc.returncode != 0
    assert "calibration.cont: unknown key" in proc.stdout + proc.stderr
