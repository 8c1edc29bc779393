"""The stage table (tasks/) is the one list of stages: the doit tasks, the artifact keys, `quantflow list` and the
build summary are made from it, and the installed package carries tasks/ and aipp_templates/ as they are."""
from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from quantflow.config import config_from_dict
from quantflow.io.digest import SOURCE_PACKAGES
from quantflow.pipeline import doit_graph
from quantflow.pipeline.build import Build
from quantflow.tasks import STAGES
from quantflow.tasks.stage import Stage

REPO = Path(__file__).resolve().parents[1]


def _cfg(tmp_path, **sections):
    d = tomllib.loads((REPO / "quantflow.toml").read_text())
    for section, values in sections.items():
        d.setdefault(section, {}).update(values)
    return config_from_dict(d, root=tmp_path)


def test_every_stage_needs_only_stages_listed_before_it():
    names = list(STAGES)
    cfg = config_from_dict(tomllib.loads((REPO / "quantflow.toml").read_text()), root=REPO)
    for i, (name, stage) in enumerate(STAGES.items()):
        assert stage.name == name and stage.doc and callable(stage.run)
        assert all(n in names[:i] for n in stage.needed(cfg)), name
        if stage.keyed:
            assert stage.outputs and stage.key_inputs is not None, name
        else:
            assert stage.status is not None, name


def test_the_doit_tasks_are_the_table():
    assert doit_graph.DEFAULT_TASKS == list(STAGES)
    assert all(callable(getattr(doit_graph, f"task_{name}")) for name in STAGES)


def test_an_unused_stage_stands_for_what_it_needs(tmp_path):
    with_train = Build(_cfg(tmp_path))
    assert "train" in [s.name for s in with_train.stages()]
    assert with_train.needs(STAGES["graph"]) == ["train", "sample"]
    d = tomllib.loads((REPO / "quantflow.toml").read_text())
    del d["train"]
    without = Build(config_from_dict(d, root=tmp_path))
    assert "train" not in [s.name for s in without.stages()]
    assert without.needs(STAGES["sample"]) == ["preflight"] and without.needs(STAGES["graph"]) == ["preflight", "sample"]


@pytest.mark.parametrize("quantization,used", [({}, False), ({"fallback": "auto"}, True),
                                                ({"sensitivity": "always"}, True)])
def test_the_per_layer_analysis_is_a_stage_only_where_every_build_needs_it(tmp_path, quantization, used):
    b = Build(_cfg(tmp_path, quantization=quantization))
    assert ("sensitivity" in [s.name for s in b.stages()]) == used
    assert ("sensitivity" in b.needs(STAGES["gate"])) == used and "calibrate" in b.needs(STAGES["gate"])
    assert ("sensitivity" in b.needs(STAGES["fallback"])) == (quantization.get("fallback") == "auto")


def test_when_the_analysis_runs_does_not_change_the_calibration(tmp_path):
    keys = {Build(_cfg(tmp_path, quantization=q, calibration=c)).key("calibrate") for q, c in [({}, {}), ({"sensitivity": "always", "sensitivity_images": 8}, {}), ({}, {"batch_size": 4})]}
    assert len(keys) == 1
    corrected = {Build(_cfg(tmp_path, quantization={"bias_correction": True, "sensitivity_images": n})).key("calibrate")
                 for n in (8, 16)}
    assert len(corrected) == 2   # bias correction measures its shifts on those images


def test_a_stage_added_to_the_table_gets_a_task_a_key_and_a_folder(tmp_path, monkeypatch):
    extra = Stage(name="extra", doc="a stage added for the test", run=lambda b: None, needs=("aipp",),
                  key_inputs=lambda b: {"setting": 1}, outputs=("extra.json",))
    monkeypatch.setitem(STAGES, "extra", extra)
    b = Build(_cfg(tmp_path))
    monkeypatch.setitem(doit_graph._bound, "build", b)
    task = doit_graph._task(extra)
    assert task["task_dep"] == ["aipp"] and task["doc"] == extra.doc
    folder = b.dir("extra")
    assert folder.parent.name == "extra" and task["targets"] == [str(folder / "extra.json"), str(folder / ".extra.done")]
    assert (folder / "key_inputs.json").is_file()
    inputs = b._key("extra")[1]
    assert inputs["inputs"] == {"setting": 1} and inputs["upstream"] == {"aipp": b.key("aipp")}
    monkeypatch.setitem(STAGES, "extra", Stage(**{**extra.__dict__, "key_inputs": lambda b: {"setting": 2}}))
    assert Build(b.cfg).key("extra") != b.key("extra")   # its own inputs enter its key


@pytest.mark.slow
def test_the_wheel_carries_tasks_and_templates_byte_for_byte(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(REPO)], check=True, capture_output=True, timeout=600)
    wheel = next(tmp_path.glob("*.whl"))
    with zipfile.ZipFile(wheel) as z:
        for folder, package in (("tasks", "quantflow/tasks"), ("aipp_templates", "quantflow/aipp_templates")):
            files = sorted(p for p in (REPO / folder).iterdir() if p.suffix in (".py", ".cfg"))
            assert files
            for p in files:
                assert z.read(f"{package}/{p.name}") == p.read_bytes(), p
        assert not [n for n in z.namelist() if n.startswith("benchmarks/")]  # measurements stay in the checkout
    assert set(SOURCE_PACKAGES) == {"quantflow", "quantflow.tasks", "quantflow.aipp_templates"}
