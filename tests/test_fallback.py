"""The failing case of the accuracy issue, end to end through doit: a MobileNetV1-style ReLU6 network whose first
depthwise block's output channels are 256x apart in range (examples/mobilenet_v1_imbalanced,
quantflow.demo.mbv1.imbalance), which one INT8 scale per tensor cannot hold.

- fallback off: the gate fails, runs the per-layer analysis, names the most sensitive layers (the pointwise layer
  reading that tensor first, far below the rest) and the setting to try; the report is written all the same;
- fallback = "auto": that layer goes back to float16 (tuned on calibration images), the build passes on every
  held-out image, the report names it and the deploy graph has no AscendQuant in front of it;
- no range method rescues it: plain KL, which clips the wide channel instead, fails the gate too.

Every build here has ``quantization.recover = "off"``: the recovery's equalization passes this network all-INT8
(tests/test_recovery_example.py); these tests are the fallback's, the last resort.
"""
from __future__ import annotations

import base64
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from support.project import REPO, copy_project, run_doit

EXAMPLE = "examples/mobilenet_v1_imbalanced"
SECTIONS = ("verdict", "per-class", "sensitivity", "histograms", "fallback")
WORST = "Default/features-SequentialCell/2-SequentialCell/0-Conv2d/Conv2D-op0"   # the layer reading the tensor


class _Report(HTMLParser):
    """Section ids, the text of each section, and the image sources."""

    def __init__(self):
        super().__init__()
        self.sections: dict[str, str] = {}
        self.images: list[str] = []
        self._current = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self._current = a.get("id")
            self.sections[self._current] = ""
        if tag == "img":
            self.images.append(a["src"])

    def handle_endtag(self, tag):
        if tag == "section":
            self._current = None

    def handle_data(self, data):
        if self._current:
            self.sections[self._current] += data


def _parse(path: Path) -> _Report:
    r = _Report()
    r.feed(path.read_text(encoding="utf-8"))
    return r


def _config(project: Path, name: str, edit=lambda t: t) -> str:
    text = edit((project / EXAMPLE / "quantflow.toml").read_text()).replace(
        "[quantization]\n", '[quantization]\nrecover = "off"\n')
    (project / EXAMPLE / name).write_text(text)
    return f"config={EXAMPLE}/{name}"


@pytest.fixture(scope="module")
def weak(tmp_path_factory):
    project = copy_project(tmp_path_factory.mktemp("weak"))
    shutil.copytree(REPO / EXAMPLE, project / EXAMPLE)
    return project


@pytest.fixture(scope="module")
def failing(weak):
    proc = run_doit(weak, _config(weak, "off.toml", lambda t: t.replace('fallback = "auto"', 'fallback = "off"')))
    return weak, proc


def test_plain_kl_fails_the_gate_and_names_the_sensitive_layers(failing):
    project, proc = failing
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "accuracy gate: FAIL" in out and "exceeds evaluation.threshold" in out
    # the failing gate ran the per-layer analysis (fallback off: no stage of the build needed it before)
    sensitivity = json.loads(next((project / EXAMPLE / "build" / "artifacts" / "sensitivity")
                                  .glob("*/sensitivity.json")).read_text())
    worst = {r["node"]: r["scope"] for r in sensitivity["ops"]}[sensitivity["ranking"][0]]
    # the imbalanced tensor feeds the first pointwise convolution: it ranks first, far below the rest
    assert worst == WORST
    db = sorted(r["output"]["sqnr_db"] for r in sensitivity["ops"])
    assert db[0] < db[1] - 10
    message = out[out.index("Most sensitive layers:"):]
    assert message.index(worst) < 200 and message.count("Conv2D-op0 (output SQNR") == 5
    assert 'quantization.fallback = "auto"' in message
    report = _parse(next((project / EXAMPLE / "build" / "artifacts" / "gate").glob("*/report.html")))
    assert "FAIL" in report.sections["verdict"]
    assert "fallback is off" in report.sections["fallback"]


def test_auto_fallback_rolls_the_worst_layer_back_and_passes(failing):
    project, _ = failing
    proc = run_doit(project, _config(project, "no_recovery.toml"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    latest = json.loads((project / EXAMPLE / "build" / "latest.json").read_text())
    worst = WORST
    assert latest["float16_fallback"] == [worst] and latest["gate"]["passed"]
    assert f"build report: {latest['report']}" in proc.stdout

    fallback = json.loads((Path(latest["artifacts"]["fallback"]) / "fallback.json").read_text())
    steps = fallback["steps"]
    assert [s["passed"] for s in steps] == [False, True]
    # tuned on the calibration folder's 100 images beyond the calibration sample (the sample tops them up only below
    # 64), never on a held-out image: the gate judges all 359
    gate = json.loads((Path(latest["artifacts"]["gate"]) / "accuracy_report.json").read_text())
    tuned, judged = fallback["tuning"]["names"], gate["judged"]
    assert set(tuned).isdisjoint(judged) and len(tuned) == 100 and gate["images"] == len(judged) == 359
    assert all(Path(n).parts[-3] == "calib_data" for n in tuned)
    assert "beyond the calibration sample" in gate["tuning"]["source"]
    assert gate["tuning"]["images"] == len(tuned) and gate["tuning"]["passed"]
    assert steps[0]["drop"] > 0.05 and steps[1]["drop"] <= 0.01 and steps[1]["int8_ops"] == steps[0]["int8_ops"] - 1

    # the deploy graph: no AscendQuant feeds the rolled-back layer; every other calibrated layer is INT8
    graph = onnx.load(latest["deploy_onnx"]).graph
    quantized = {n.output[0] for n in graph.node if n.op_type == "AscendQuant"}
    int8_layers = {n.name for n in graph.node if n.op_type in ("Conv", "Gemm") and n.input[0] in quantized}
    assert worst not in int8_layers and len(int8_layers) == len(quantized) == steps[-1]["int8_ops"]
    scopes = {r["scope"] for r in json.loads(Path(latest["sensitivity"]).read_text())["ops"]}
    assert int8_layers == scopes - {worst}

    report = _parse(Path(latest["report"]))
    assert set(SECTIONS) <= set(report.sections)
    assert "PASS" in report.sections["verdict"] and "fallback tuned on" in report.sections["verdict"]
    assert worst in report.sections["fallback"] and worst in report.sections["sensitivity"]
    assert len(report.images) >= 3  # sensitivity chart, histograms of the worst layers, fallback steps
    for src in report.images:
        assert src.startswith("data:image/png;base64,")
        png = base64.b64decode(src.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        img = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)
        assert img is not None and img.shape[0] > 50 and img.shape[1] > 50


def test_no_range_method_rescues_it(failing):
    project, _ = failing
    cfg = _config(project, "kl.toml", lambda t: t.replace("per_class_min = 15\n", 'per_class_min = 15\nmethod = "kl"\n'
                                                          "kl_max_clipped = 1.0\n")
                  .replace('fallback = "auto"', 'fallback = "off"'))
    proc = run_doit(project, cfg)
    assert proc.returncode != 0 and "accuracy gate: FAIL" in proc.stdout
    gate = json.loads(max((project / EXAMPLE / "build" / "artifacts" / "gate").glob("*/accuracy_report.json"),
                          key=lambda p: p.stat().st_mtime).read_text())
    assert gate["calibration_method"] == "kl" and not gate["passed"] and gate["drop"] > 0.02
