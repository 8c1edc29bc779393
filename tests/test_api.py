"""The Python API (quantflow.api, exported from quantflow): ``build`` returns a BuildResult whose verdict, figures,
report and artifacts are the build's own files; a failing gate is a result; a bad configuration raises quantflow's
error naming the field; ``quantize`` writes the configuration ``quantflow init`` would, with the options applied,
beside the build, and builds it; the TOML it writes reads back as written."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from support.project import IMAGES_PER_CLASS, tiny_config, tiny_onnx, tiny_project

import quantflow
from quantflow.errors import ConfigError, QuantflowError
from quantflow.io.toml import dumps

OUTPUTS_GATE = 'metric = "outputs"\nmin_cosine = {}'


# ------------------------------------------------------------------------------------------------ fast

def test_the_api_is_exported_from_the_package():
    assert {"build", "quantize", "BuildResult", "Figure", "QuantflowError", "ConfigError"} <= set(quantflow.__all__)
    assert quantflow.build is quantflow.api.build and quantflow.quantize is quantflow.api.quantize


def test_toml_written_reads_back_as_the_same_data():
    data = {"model": {"onnx": "m.onnx", "input_shape": [1, 3, 32, 32], "note": 'a "quoted" \\ path\n'},
            "normalization": {"mean": [0.5, 0.25], "scale": "0-1"},
            "evaluation": {"threshold": 0.01, "on": True, "min": {"agreement": 0.9},
                           "parts": {"boxes": {"axis": 1, "slice": "0:4"}}},
            "build": {"output_dir": ".", "skip": None}}
    text = dumps(data, header="written by a test\nsecond line")
    assert text.startswith("# written by a test\n# second line\n")
    del data["build"]["skip"]   # TOML has no null: a None leaves the key out
    assert tomllib.loads(text) == data


def test_toml_refuses_a_value_it_cannot_hold_naming_the_key():
    with pytest.raises(TypeError, match="model.shape"):
        dumps({"model": {"shape": object()}})


def test_a_bad_configuration_raises_quantflows_error_naming_the_field(tmp_path):
    project = tiny_project(tmp_path / "p", tiny_config().replace("count = 60", "count = -3"))
    with pytest.raises(ConfigError, match=r"calibration\.count"):
        quantflow.build(project / "quantflow.toml")


def test_a_missing_configuration_raises_naming_the_file(tmp_path):
    with pytest.raises(ConfigError, match="nowhere.toml"):
        quantflow.build(tmp_path / "nowhere.toml")


def test_an_unknown_stage_is_refused():
    with pytest.raises(ConfigError, match="unknown stage 'gates'"):
        quantflow.build("quantflow.toml", stages=["gates"])


def test_quantize_needs_held_out_images(tmp_path):
    with pytest.raises(ConfigError, match="evaluation"):
        quantflow.quantize(tmp_path / "m.onnx", tmp_path)


@pytest.mark.parametrize("option,message", [("treshold", "did you mean threshold"),
                                            ("seed", "several sections"),
                                            ("batch_size", "config=")])
def test_quantize_names_an_option_it_cannot_place(tmp_path, option, message):
    from quantflow.api import _section_of
    with pytest.raises(ConfigError, match=message):
        _section_of(option)


def test_quantize_rejects_a_model_it_cannot_read(tmp_path):
    with pytest.raises(ConfigError, match="model 'net.pt'"):
        quantflow.quantize("net.pt", tmp_path, tmp_path)


# ------------------------------------------------------------------------------------------------ builds (slow)

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The tiny ONNX project built through the API: (project, result)."""
    project = tiny_project(tmp_path_factory.mktemp("api_build"))
    return project, quantflow.build(project / "quantflow.toml")


@pytest.mark.slow
def test_build_returns_the_gates_verdict_figures_and_artifacts(built):
    project, r = built
    latest = json.loads((project / "build" / "latest.json").read_text())
    report = json.loads((Path(latest["artifacts"]["gate"]) / "accuracy_report.json").read_text())
    assert r.passed is report["passed"] is True and r.verdict == report["verdict"]
    assert r.report == report and [f.id for f in r.figures] == [f["id"] for f in report["figures"]]
    assert r.keys == latest["keys"]
    assert r.artifacts["deploy_onnx"] == Path(latest["deploy_onnx"]) and r.artifacts["deploy_onnx"].is_file()
    assert r.report_html.is_file() and r.report_html.parent == Path(latest["artifacts"]["gate"])
    assert r.config_file == project / "quantflow.toml" and r.config.calibration.count == 60


@pytest.mark.slow
def test_build_again_reruns_only_the_stages_asked_for(built):
    project, first = built
    gate = first.artifacts["gate"]
    marker = gate / ".gate.done"
    before = marker.stat().st_mtime_ns
    again = quantflow.build(project / "quantflow.toml", always=["gate"])
    assert again.keys == first.keys and again.verdict == first.verdict
    assert marker.stat().st_mtime_ns > before     # the gate ran again
    assert (first.artifacts["calibrate"] / ".calibrate.done").stat().st_mtime_ns < before


@pytest.mark.slow
def test_a_failing_gate_is_a_result_not_an_exception(tmp_path):
    project = tiny_project(tmp_path / "p", tiny_config().replace("threshold = 1.0", OUTPUTS_GATE.format(0.999999)))
    r = quantflow.build(project / "quantflow.toml")
    assert r.passed is False and r.verdict in ("FAIL", "UNDECIDED")
    assert r.report["passed"] is False and r.report_html.is_file()
    assert not (project / "build" / "latest.json").exists()   # latest.json names builds that passed


@pytest.mark.slow
def test_a_stage_that_fails_on_its_input_raises_its_own_error(tmp_path):
    project = tiny_project(tmp_path / "p")
    broken = next((project / "calib_data").rglob("*.png"))
    broken.write_bytes(b"not an image")
    with pytest.raises(QuantflowError, match=broken.name):
        quantflow.build(project / "quantflow.toml")


@pytest.mark.slow
def test_quantize_builds_an_onnx_model_from_two_folders_and_writes_a_repeatable_config(tmp_path):
    project = tiny_project(tmp_path / "p")
    (project / "quantflow.toml").unlink()
    out = tmp_path / "out"
    r = quantflow.quantize(project / "tiny.onnx", project / "calib_data", project / "eval_data", output_dir=out,
                           mean=[0.47, 0.46, 0.47], std=[0.26, 0.26, 0.26], threshold=1.0,
                           per_class_min=IMAGES_PER_CLASS, count=60)
    written = out / "quantflow.toml"
    data = tomllib.loads(written.read_text())
    assert data["normalization"]["mean"] == [0.47, 0.46, 0.47] and data["evaluation"]["threshold"] == 1.0
    assert data["build"]["output_dir"] == "." and (out / data["model"]["onnx"]).resolve() == project / "tiny.onnx"
    assert r.config_file == written and r.verdict == "PASS" and r.passed
    assert r.artifacts["deploy_onnx"].is_file() and str(r.artifacts["deploy_onnx"]).startswith(str(out))
    # the same build again from the written file: every stage found done under the same keys
    assert quantflow.build(written).keys == r.keys


def test_quantize_reports_a_bad_option_value_naming_the_field(tmp_path):
    project = tiny_project(tmp_path / "p")
    tiny_onnx(project / "tiny.onnx")
    with pytest.raises(ConfigError, match=r"normalization\.scale"):
        quantflow.quantize(project / "tiny.onnx", project / "calib_data", project / "eval_data",
                           output_dir=tmp_path / "out", scale="0-100")
