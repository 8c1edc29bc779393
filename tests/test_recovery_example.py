"""examples/mobilenet_v1_imbalanced end to end through doit, with the recovery on (the default): its first
depthwise block's channels, 256x apart in range, are equalized with the pointwise layer after it (exact on the
float network), and the build passes its gate all-INT8, with ``quantization.fallback = "off"`` (and, as shipped,
"auto" rolls no layer back)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
from support.project import REPO, copy_project, run_doit

from quantflow.io.files import TUNING_CHECK

EXAMPLE = "examples/mobilenet_v1_imbalanced"
WORST = "Default/features-SequentialCell/2-SequentialCell/0-Conv2d/Conv2D-op0"   # the layer reading the tensor


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    project = copy_project(tmp_path_factory.mktemp("imbalanced"))
    shutil.copytree(REPO / EXAMPLE, project / EXAMPLE)
    return project


def _latest(project: Path) -> dict:
    return json.loads((project / EXAMPLE / "build" / "latest.json").read_text())


def test_recovery_passes_it_all_int8_without_the_fallback(project):
    text = (project / EXAMPLE / "quantflow.toml").read_text().replace('fallback = "auto"', 'fallback = "off"')
    (project / EXAMPLE / "off.toml").write_text(text)
    proc = run_doit(project, f"config={EXAMPLE}/off.toml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    latest = _latest(project)
    gate = json.loads((Path(latest["artifacts"]["gate"]) / "accuracy_report.json").read_text())
    assert gate["passed"] and gate["drop"] <= 0.01 and latest["float16_fallback"] == []
    record = json.loads((Path(latest["artifacts"]["recover"]) / "recovery.json").read_text())
    step = record["steps"][0]
    assert record["mode"] == "auto" and step["method"] == "equalize" and step["kept"]
    assert any(p["l2"] and p["pair"].endswith(WORST) for p in step["notes"]["pairs"])
    node = next(n for n, info in record["layers"].items() if info["scope"] == WORST)
    assert record["before"][node] < 5 and step["after"][node] > 25   # dB: the narrow channels are back
    # the deploy graph: the layer reading the equalized tensor is INT8 (an AscendQuant feeds it)
    graph = onnx.load(latest["deploy_onnx"]).graph
    quantized = {n.output[0] for n in graph.node if n.op_type == "AscendQuant"}
    assert WORST in {n.name for n in graph.node if n.op_type == "Conv" and n.input[0] in quantized}


def test_as_shipped_recovery_runs_before_the_fallback(project):
    """fallback = "auto": equalization first (guarded by the recovery images), then the costly methods, each
    checked on the tuning images (kept where it brings INT8 nearer FP32 there and on the recovery images, image by image,
    or, where the check fails, unless it harms there), and the fallback only after them.  (Measured: the check passes after equalization alone and no layer is rolled back;
    docs/recovery.md.)"""
    proc = run_doit(project, f"config={EXAMPLE}/quantflow.toml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    latest = _latest(project)
    assert latest["gate"]["passed"] and len(latest["float16_fallback"]) <= 3
    record = json.loads((Path(latest["artifacts"]["recover"]) / "recovery.json").read_text())
    methods = [s["method"] for s in record["steps"]]
    assert methods[0] == "equalize" and record["steps"][0]["kept"]
    assert methods[1:] == ["ranges", "adaround"]
    checked = [s for s in record["steps"] if s.get("check")]
    assert checked[0]["method"] == "equalize"    # it changed the parameters: checked like the others
    # a step the check kept is what the check after the recovery reports; none kept: the first check
    after = record["check_after"]
    kept = [s for s in checked if s["kept"]]
    last = kept[-1]["check"] if kept else record["check"]
    assert after["kept"] == bool(kept) and (after["passed"], after["verdict"]) == (last["passed"], last["verdict"])
    fallback = json.loads((Path(latest["artifacts"]["fallback"]) / "fallback.json").read_text())
    # the fallback's first check is on the recovered parameters: the recovery's last verdict
    assert (fallback["steps"][0]["passed"], fallback["steps"][0]["verdict"]) == (last["passed"], last["verdict"])
    # which the recovery kept beside its parameters, for the fallback's step 0 to take instead of checking again
    # as JSON, not a pickle: artifacts cross machines through the cache
    made = json.loads((Path(latest["artifacts"]["recover"]) / TUNING_CHECK).read_text())
    assert (made["passed"], made["verdict"]) == (last["passed"], last["verdict"])
    # and how many checks of the tuning images it made (the fallback's margin grows with them)
    assert made["looks"] == 1 + len(checked) and fallback["steps"][0]["looks"] == made["looks"]
    assert [s["looks"] for s in fallback["steps"]] == list(range(made["looks"], made["looks"] + len(fallback["steps"])))
