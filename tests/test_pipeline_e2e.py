"""The doit graph end to end on the shipped demo (from its shipped checkpoint: the build trains nothing)."""
import json
import re
import shutil
from pathlib import Path

import pytest
from support.project import run_doit, task_lines

from quantflow import aipp_templates

# the demo's tasks: no "sensitivity" (fallback off: only a failing gate runs the per-layer analysis)
ALL = ["preflight", "train", "sample", "graph", "calibrate", "recover", "fallback", "export", "aipp", "atc", "gate",
       "summary"]
KEYED = ["graph", "calibrate", "recover", "fallback", "export", "aipp", "atc", "gate"]


def latest(project: Path) -> dict:
    return json.loads((project / "build" / "latest.json").read_text())


def test_first_run_executes_every_stage(built_demo):
    project, proc = built_demo
    assert task_lines(proc.stdout) == {t: "up-to-date" if t == "train" else "ran" for t in ALL}
    out = proc.stdout
    assert "SKIPPED AIR export" in out and "Ascend backend" in out
    assert "exported INT8 deploy graph (4 AscendQuant/AscendDequant pairs)" in out  # the stem: float16
    assert "IR float output matches MindSpore on 2 calibration images" in out
    assert "SKIPPED atc conversion for Ascend310P3" in out and "no .om was written" in out
    assert not list((project / "build").rglob("*.om"))
    s = latest(project)
    dirs = {stage: Path(d) for stage, d in s["artifacts"].items()}
    expected = {"graph": ["graph.json", "graph.onnx", "model.mindir"],
                "calibrate": ["qparams.json", "qparams.npz", "calibration.txt", "histograms.npz"],
                "recover": ["qparams.json", "qparams.npz", "recovery.json", "recovery.txt"],
                "fallback": ["qparams.json", "qparams.npz", "fallback.json"],
                "export": ["deploy.onnx", "deploy.mindir", "deploy_net.py", "record.txt", "model.mindir", "graph.onnx"],
                "aipp": ["aipp.cfg", "aipp_check.json"], "atc": ["atc.json"],
                "gate": ["accuracy_report.json", "accuracy_report.txt", "report.html"]}
    for stage, names in expected.items():
        for name in names + ["key_inputs.json"]:
            assert (dirs[stage] / name).is_file(), (stage, name)
    assert s["om"] is None and s["air"] is None and s["atc"].startswith("skipped: ")
    kdir = dirs["graph"]
    graph = json.loads((kdir / "graph.json").read_text())
    assert graph["ops"]["Conv2D"] == 3 and graph["verify"]["relative_diff"] < 1e-3
    assert graph["float16_assumed_ops"] == []  # BatchNorm folded; the rest is exact in float16
    qparams = json.loads((dirs["calibrate"] / "qparams.json").read_text())
    assert [q["op"] for q in qparams["ops"]] == ["Conv2D", "Conv2D", "Conv2D", "MatMul", "MatMul"]
    # the stem reads 3 channels (CANN runs it in float16); every other layer runs in INT8, convolutions included
    assert [(q["op"], q["device_precision"]) for q in qparams["ops"]][:2] == [("Conv2D", "float16"), ("Conv2D", "int8")]
    assert json.loads((dirs["fallback"] / "qparams.json").read_text()) == qparams  # fallback off: as calibrated
    assert s["float16_fallback"] == [] and s["report"] == str(dirs["gate"] / "report.html")
    assert s["sensitivity"] is None and not (project / "build" / "artifacts" / "sensitivity").exists()  # passed
    assert f"build report: {s['report']}" in out
    assert s["gate"]["passed"] is True
    assert s["gate"]["fp32_top1"] >= 0.95  # the stated FP32 accuracy of the demo model
    assert s["gate"]["fp32_top1"] - s["gate"]["int8_top1"] <= 0.01
    assert "accuracy gate: PASS" in (dirs["gate"] / "accuracy_report.txt").read_text()
    # the FP32 accuracy training measured (MindSpore) is the gate's (the graph IR in onnxruntime)
    metrics = json.loads((project / "quantflow" / "demo" / "checkpoints" / "digits.train.json").read_text())["metrics"]
    assert metrics["heldout_top1"] == s["gate"]["fp32_top1"]
    assert set(s["keys"]) == set(KEYED)
    assert all(re.fullmatch(r"[0-9a-f]{16}", key) and dirs[stage].name == key for stage, key in s["keys"].items())


def test_second_run_executes_no_task(built_demo):
    project, _ = built_demo
    proc = run_doit(project)
    assert proc.returncode == 0, proc.stderr
    assert task_lines(proc.stdout) == {t: "up-to-date" for t in ALL}


def _threshold(project: Path) -> Path:
    return project / "quantflow.toml"


def _aipp_template(project: Path) -> Path:
    """A copy of the shipped template beside the config: the same content (same key) until edited."""
    local = project / "static_rgb888_u8.cfg"
    if not local.exists():
        shutil.copy(aipp_templates.path(local.name), local)
    return local


def _sampled_image(project: Path) -> Path:
    manifest = json.loads((project / "build" / "calibration" / "manifest.json").read_text())
    return project / manifest["images"][0]["path"]


def _edit(path: Path) -> None:
    if path.suffix == ".toml":
        path.write_text(path.read_text().replace("threshold = 0.01", "threshold = 0.02"))
    elif path.suffix == ".cfg":
        path.write_text(path.read_text() + "# edited\n")
    else:
        import cv2
        img = cv2.imread(str(path), cv2.IMREAD_COLOR)
        img[0, 0] = 255 - img[0, 0]
        cv2.imwrite(str(path), img)


# the demo's calibration folder holds 100 images beyond its sample of 200: the recovery checks its methods on them,
# with the gate's limits and through the AIPP config, so a change to either reruns it and what reads its parameters
CHECKED = {"recover", "fallback", "export", "atc"}


@pytest.mark.parametrize("target,rerun", [
    (_threshold, {"gate"} | CHECKED),
    (_aipp_template, {"aipp", "atc", "gate"} | CHECKED),  # the gate's INT8 path runs through the AIPP config
    (_sampled_image, {"sample"} | set(KEYED)),
])
def test_a_change_reruns_only_what_depends_on_it_and_reverting_finds_the_cache(built_demo, target, rerun):
    project, _ = built_demo
    keys_before = latest(project)["keys"]
    path = target(project)
    original = path.read_bytes()
    try:
        _edit(path)
        proc = run_doit(project)
        assert proc.returncode == 0, proc.stdout[-3000:]
        status = task_lines(proc.stdout)
        assert {t for t, st in status.items() if st == "ran"} == rerun | {"preflight", "summary"}, status
        keys = latest(project)["keys"]
        assert {stage for stage in KEYED if keys[stage] != keys_before[stage]} == rerun - {"sample"}
    finally:
        path.write_bytes(original)
    proc = run_doit(project)
    assert proc.returncode == 0
    status = task_lines(proc.stdout)
    assert all(status[t] == "up-to-date" for t in KEYED), status
    # only the cheap checks, latest.json (pointed back at the cached artifacts) and, for a changed image file,
    # the sampler (whose manifest comes out as before) run again
    assert {t for t, st in status.items() if st == "ran"} == {"preflight", "summary"} | (rerun & {"sample"})
    assert latest(project)["keys"] == keys_before


def test_broken_quantization_fails_the_gate(built_demo):
    project, _ = built_demo
    # clipping every activation at its median destroys the INT8 model
    broken = (project / "quantflow.toml").read_text().replace('method = "mse"', 'method = "percentile"\npercentile = 50.5')
    (project / "broken.toml").write_text(broken)
    proc = run_doit(project, "config=broken.toml")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "accuracy gate: FAIL" in out
    assert "AccuracyGateError" in out and "exceeds evaluation.threshold 1.00" in out
    status = task_lines(proc.stdout)
    assert status["gate"] == "ran" and "summary" not in status
    report = next(p for p in (project / "build" / "artifacts" / "gate").glob("*/accuracy_report.json")
                  if not json.loads(p.read_text())["passed"])
    assert not (report.parent / ".gate.done").exists()
    # the failing gate ran the per-layer analysis to name the layers to try, kept under its key like a stage's
    analysis = next((project / "build" / "artifacts" / "sensitivity").glob("*/sensitivity.json"))
    assert (analysis.parent / ".sensitivity.done").is_file()
    worst = json.loads(analysis.read_text())["ranking"][0]
    worst_scope = next(r["scope"] for r in json.loads(analysis.read_text())["ops"] if r["node"] == worst)
    assert f"Most sensitive layers: {worst_scope} (output SQNR" in out
    # a failed gate is not cached: the next run evaluates (and fails) again
    again = run_doit(project, "config=broken.toml")
    assert again.returncode != 0 and task_lines(again.stdout)["gate"] == "ran"


def test_wrong_normalization_fails_in_preflight(built_demo):
    project, _ = built_demo
    wrong = (project / "quantflow.toml").read_text().replace('scale = "0-1"', 'scale = "0-255"')
    (project / "wrong_norm.toml").write_text(wrong)
    proc = run_doit(project, "config=wrong_norm.toml")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "AippMismatchError" in out and "does not reproduce the training preprocessing" in out
    assert "scale=0-255" in out
    status = task_lines(proc.stdout)
    assert status["preflight"] == "ran" and "sample" not in status  # caught by preflight, before any real work


def test_invalid_config_is_reported_by_field(built_demo, tmp_path):
    project, _ = built_demo
    bad = (project / "quantflow.toml").read_text().replace("count = 200", "count = 200\ncont = 3")
    (project / "bad.toml").write_text(bad)
    proc = run_doit(project, "config=bad.toml")
    assert proc.returncode != 0
    assert "calibration.cont: unknown key" in proc.stdout + proc.stderr


def test_a_second_build_in_the_same_folder_waits_for_the_first(built_demo):
    import subprocess
    import sys
    import time

    project, _ = built_demo
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from quantflow.pipeline.lock import acquire; "
                               "acquire('build'); print('held', flush=True); time.sleep(4)"],
                              cwd=project, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    start = time.monotonic()
    proc = run_doit(project)
    waited = time.monotonic() - start
    holder.wait()
    assert proc.returncode == 0
    assert f"another build holds {project / 'build' / '.quantflow.lock'} (pid {holder.pid}); waiting" in proc.stderr
    assert waited > 1.0  # it could not start before the holder let go
    status = task_lines(proc.stdout)
    assert all(status[t] == "up-to-date" for t in KEYED)  # then it found the first build's artifacts
