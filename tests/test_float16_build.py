"""Issue 43 part 2: a float16-only build (``quantization.skip = ["*"]``: no op left in INT8) is a build like any
other -- its deploy graph holds no AscendQuant / AscendDequant, its AIPP config is verified, its gate judges it --
and every build's report puts INT8 beside that float16 floor (part 1)."""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from support.project import copy_project, run_quantflow

pytestmark = pytest.mark.slow


def _latest(project: Path) -> dict:
    return json.loads((project / "build" / "latest.json").read_text())


@pytest.fixture(scope="module")
def float16_build(tmp_path_factory):
    project = copy_project(tmp_path_factory.mktemp("float16"))
    text = (project / "quantflow.toml").read_text()
    (project / "quantflow.toml").write_text(text.replace("[aipp]", '[quantization]\nskip = ["*"]\n\n[aipp]', 1))
    done = run_quantflow(project, "build")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return project, done


def test_skip_everything_builds_a_float16_deploy_graph_and_gates_it(float16_build):
    project, _ = float16_build
    latest = _latest(project)
    qparams = json.loads(Path(latest["qparams"]).read_text())
    assert qparams["ops"] and all(op["device_precision"] == "float16" for op in qparams["ops"])
    ops = {n.op_type for n in onnx.load(latest["deploy_onnx"]).graph.node}
    assert "Conv" in ops and not ops & {"AscendQuant", "AscendDequant", "AscendAntiQuant"}
    assert Path(latest["aipp_config"]).is_file()
    report = json.loads(Path(latest["accuracy_report"]).with_suffix(".json").read_text())
    assert report["quantized_ops"] == 0 and report["passed"]
    # the build IS the float16 path: it changes exactly what the floor changes, on no INT8 multiply-add
    d = report["distance"]
    assert d["int8_changed"] == d["float16_changed"] and d["int8_mac_share"] == 0.0 and d["macs"] > 0


def test_every_report_carries_the_floor_in_json_markdown_and_html(built_demo):
    latest = _latest(built_demo[0])
    gate = Path(latest["accuracy_report"]).parent
    report = json.loads((gate / "accuracy_report.json").read_text())
    d, f16 = report["distance"], report["float16"]
    assert d["unit"] == "classes" and d["images"] == report["images"] == len(report["changed"]["per_image"])
    assert d["int8_changed"] == sum(report["changed"]["per_image"])
    assert 0.0 < d["int8_mac_share"] <= 1.0 and d["int8_macs"] <= d["macs"]
    assert f16["verdict"] in ("PASS", "FAIL", "UNDECIDED") and f16["figures"][0]["id"] == "drop"
    assert "Against the float16 floor" in (gate / "gate_summary.md").read_text()
    page = (gate / "report.html").read_text()
    assert 'id="floor"' in page and "INT8 against the float16 floor" in page
