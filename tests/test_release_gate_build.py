"""The release gate end to end (slow): `quantflow build` of the tiny ONNX project (support.project.tiny_project) gated
on its output's cosine; PASS, FAIL and UNDECIDED by limits chosen against the measured interval; a baseline and a
worse build; the same build against itself; another held-out set; the JUnit and Markdown files latest.json names;
`quantflow compare`."""
from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support.project import run_quantflow, tiny_config, tiny_project

OUTPUTS_GATE = 'metric = "outputs"\nmin_cosine = 0.5'


def _config(project: Path, name: str, out: str, *replace: tuple[str, str]) -> str:
    text = (project / "quantflow.toml").read_text().replace('output_dir = "build"', f'output_dir = "{out}"')
    for old, new in replace:
        assert old in text, old
        text = text.replace(old, new)
    (project / name).write_text(text)
    return name


def _report(project: Path, out: str) -> dict:
    latest = json.loads((project / out / "latest.json").read_text())
    return json.loads(Path(latest["accuracy_report"]).with_name("accuracy_report.json").read_text())


def _gate_report(project: Path, out: str) -> dict:
    """The gate's report of a build that may have failed (latest.json is written only when it passed)."""
    (found,) = (project / out / "artifacts" / "gate").glob("*/accuracy_report.json")
    return json.loads(found.read_text())


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """The tiny project gated on its output's cosine (limit 0.5), built: (folder, its figure)."""
    project = tiny_project(tmp_path_factory.mktemp("release_gate"),
                           tiny_config().replace("threshold = 1.0", OUTPUTS_GATE))
    proc = run_quantflow(project, "build")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (figure,) = _report(project, "build")["figures"]
    return project, figure


def test_limits_against_the_interval_give_pass_fail_and_undecided(gated):
    project, f = gated
    assert f["figure"] == "y cosine" and f["low"] < f["value"] < f["high"] < 1.0
    cases = {"pass": (f["low"] - 1e-6, "fail", 0, "PASS"), "fail": (f["high"] + 1e-6, "fail", 1, "FAIL"),
             "undecided": ((f["value"] + f["high"]) / 2, "fail", 1, "UNDECIDED"),
             "warned": ((f["value"] + f["high"]) / 2, "warn", 0, "UNDECIDED")}
    for name, (limit, how, code, verdict) in cases.items():
        cfg = _config(project, f"{name}.toml", f"build_{name}", ("min_cosine = 0.5", f"min_cosine = {limit!r}\n"
                                                                 f'on_undecided = "{how}"'))
        proc = run_quantflow(project, "build", cfg)
        assert proc.returncode == code, (name, proc.stdout[-3000:], proc.stderr[-3000:])
        r = _gate_report(project, f"build_{name}")
        (g,) = r["figures"]
        assert (g["low"], g["high"], g["value"]) == (f["low"], f["high"], f["value"])   # seeded: the same interval
        assert g["verdict"] == r["verdict"] == verdict and r["passed"] is (code == 0)
        assert (g["decide_images"] or 0) > (r["images"] if verdict == "UNDECIDED" else -1)
        junit = ET.parse(Path(next((project / f"build_{name}" / "artifacts" / "gate").glob("*"))) / "gate_junit.xml")
        (case,) = junit.getroot().findall("testcase")
        assert case.get("name") == "y cosine" and (case.find("failure") is not None) is (code == 1)


def test_latest_json_names_the_junit_and_markdown_files(gated):
    project, f = gated
    latest = json.loads((project / "build" / "latest.json").read_text())
    suite = ET.parse(latest["junit"]).getroot()
    assert [c.get("name") for c in suite.findall("testcase")] == ["y cosine"] and suite.get("failures") == "0"
    md = Path(latest["gate_summary"]).read_text()
    assert md.startswith("## quantflow accuracy gate: PASS") and "| y cosine |" in md
    r = _report(project, "build")
    assert len(r["held_out"]["sha256"]) == len(r["held_out"]["images"]) == r["images"]


def test_a_worse_build_fails_against_its_baseline_naming_the_figure_and_a_build_against_itself_passes(gated):
    """Clipping at the 60th percentile is worse than mse's ranges: the baseline's paired bootstrap of the difference
    lies wholly below zero; the limit (0.5) alone would pass it."""
    project, _ = gated
    worse = _config(project, "worse.toml", "build_worse",
                    ('method = "mse"', 'method = "percentile"\npercentile = 60.0'))
    proc = run_quantflow(project, "build", worse, "--baseline", "build")
    assert proc.returncode == 1, proc.stdout[-3000:]
    r = _gate_report(project, "build_worse")
    (g,) = r["figures"]
    assert g["verdict"] == "PASS" and g["baseline"]["worse"] and g["baseline"]["method"] == "paired bootstrap"
    assert r["worse"] == ["y"] and r["verdict"] == "FAIL" and r["passed"] is False
    assert "worse than the baseline" in proc.stdout + proc.stderr and "y cosine" in proc.stdout + proc.stderr
    again = run_quantflow(project, "build", "--baseline", "build")
    assert again.returncode == 0, again.stdout[-3000:]
    r = _report(project, "build")
    assert r["baseline"]["paired"] and r["figures"][0]["baseline"]["worse"] is False
    assert r["figures"][0]["baseline"]["delta"] == 0.0
    shown = run_quantflow(project, "compare", "build", "build_worse/artifacts/gate")
    assert shown.returncode == 2                      # a folder of several gate runs is no report: named
    (one,) = (project / "build_worse" / "artifacts" / "gate").glob("*")
    shown = run_quantflow(project, "compare", "build", str(one))
    assert shown.returncode == 0 and "y cosine" in shown.stdout


def test_a_baseline_on_other_held_out_images_is_a_clear_error(gated):
    project, _ = gated
    shutil.copytree(project / "eval_data", project / "eval_small")
    dropped = sorted((project / "eval_small" / "0").iterdir())[0]
    dropped.unlink()
    small = _config(project, "small.toml", "build_small", ('data_dir = "eval_data"', 'data_dir = "eval_small"'))
    proc = run_quantflow(project, "build", small, "--baseline", "build")
    assert proc.returncode == 1
    assert f"1 only in the baseline (e.g. eval_data/0/{dropped.name})" in proc.stdout + proc.stderr
