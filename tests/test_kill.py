"""Builds killed with SIGKILL at many points of every stage: the next `doit` finishes with the outputs of an
undisturbed build, and nothing half-written is ever taken as done.

Kill points are deterministic: quantflow.io.atomic's test hook (QUANTFLOW_TEST_KILL_AT) kills
the process at the first atomic write whose path contains the given text, just before the rename
(the temporary file complete, the real name not yet there) or just after it.  The points are chained
in one project, each run resuming what the previous one left; a second project is killed at seeded
random moments from outside.  Outputs are compared byte for byte, except the MindIR files MindSpore
exports (they embed a timestamp and process-dependent value names): those are compared as graphs.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.project import clean_env, copy_project, run_doit

from quantflow.frontends.mindir import read_mindir
from quantflow.io import atomic

# (text in the written path, moment) in pipeline order: at least one point in every stage
KILL_POINTS = [
    ("checkpoints/digits.ckpt", "before"),       # train (QUICK settings: not the shipped ones): the checkpoint
    ("checkpoints/digits.train.json", "before"), # train: its completion record
    ("calibration/manifest.json", "before"),     # sample
    ("/graph/", "before"),                       # graph: its first file (model.mindir)
    (".graph.done", "before"),                   # graph: everything written but the marker
    ("histograms.npz", "before"),                # calibrate
    ("calibration.txt", "after"),                # calibrate: a file in place, the stage unfinished
    ("/aipp/", "before"),                        # aipp
    ("recovery.json", "before"),                 # recover
    ("sensitivity.json", "after"),               # sensitivity (quantization.sensitivity = "always")
    ("fallback.json", "before"),                 # fallback
    ("deploy.onnx", "after"),                    # export
    ("deploy.mindir", "before"),                 # export: MindSpore's own writer, via a temporary folder
    (".export.done", "before"),                  # export
    ("atc.json", "before"),                      # atc (the skip record)
    ("report.html", "before"),                   # gate
    (".gate.done", "after"),                     # gate: marker in place, doit's record of the run lost
    ("latest.json", "before"),                   # summary
]

QUICK = {  # a short training and small samples: the same stages, in seconds
    "epochs = 12": "epochs = 1\nsteps = 12",
    "min_accuracy = 0.95": "min_accuracy = 0.0",
    "threshold = 0.01": "threshold = 1.0",
    "count = 200": "count = 40",
    "per_class_min = 15": "per_class_min = 4",
}


def _project(root: Path) -> Path:
    project = copy_project(root)
    text = (project / "quantflow.toml").read_text()
    for old, new in QUICK.items():
        assert old in text, old
        text = text.replace(old, new)
    (project / "quantflow.toml").write_text(text + '\n[quantization]\nsensitivity = "always"\nsensitivity_images = 16\n')
    return project


def _files(project: Path) -> dict[str, bytes]:
    """Every file of the build but doit's and the lock's state, paths relative, the project root masked."""
    build = project / "build"
    root = str(project).encode()
    return {p.relative_to(build).as_posix(): p.read_bytes().replace(root, b"<root>")
            for p in sorted(build.rglob("*")) if p.is_file() and not p.name.startswith((".doit", ".quantflow"))}


def _graph_signature(path: Path):
    g = read_mindir(path)
    return ([(n.name, n.op, n.inputs, n.outputs, n.scope, repr(sorted(n.attrs.items()))) for n in g.nodes],
            {k: v.tobytes() for k, v in g.initializers.items()})


def _assert_same_build(project: Path, reference: Path) -> None:
    got, want = _files(project), _files(reference)
    assert sorted(got) == sorted(want)  # no partial file left, nothing missing
    for name in want:
        if name.endswith(".mindir"):
            assert _graph_signature(project / "build" / name) == _graph_signature(reference / "build" / name), name
        else:
            assert got[name] == want[name], name
    for name in got:
        if name.endswith(".json"):
            json.loads(got[name])
        if name.endswith(".npz"):
            with np.load(project / "build" / name) as z:
                assert z.files


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    project = _project(tmp_path_factory.mktemp("reference"))
    log = project / "writes.log"
    proc = run_doit(project, env=clean_env(QUANTFLOW_TEST_WRITE_LOG=str(log)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return project, [line.split(" ", 1)[1] for line in log.read_text().splitlines()]


def test_every_kill_point_is_a_real_write_of_the_build(reference):
    _, writes = reference
    for text, _ in KILL_POINTS:
        assert any(text in w for w in writes), text
    stages = {w.split("/artifacts/")[1].split("/")[0] for w in writes if "/artifacts/" in w}
    assert stages == {"graph", "calibrate", "recover", "sensitivity", "fallback", "export", "aipp", "atc", "gate"}


def test_killed_at_every_point_the_next_doit_finishes_the_same_build(reference, tmp_path):
    ref, _ = reference
    project = _project(tmp_path / "killed")
    for text, moment in KILL_POINTS:
        proc = run_doit(project, env=clean_env(QUANTFLOW_TEST_KILL_AT=f"{text}|{moment}"))
        assert proc.returncode == -9, (text, moment, proc.stdout[-2000:], proc.stderr[-2000:])
        # whatever is under a real name is complete: every JSON parses, every archive opens
        for p in (project / "build").rglob("*"):
            if p.is_file() and p.suffix == ".json" and atomic.PARTIAL not in p.name:
                json.loads(p.read_text())
    proc = run_doit(project)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _assert_same_build(project, ref)


def test_killed_at_random_moments_the_next_doit_finishes_the_same_build(reference, tmp_path):
    ref, _ = reference
    project = _project(tmp_path / "random")
    rng = random.Random(20261203)
    for delay in [rng.uniform(2.0, 20.0) for _ in range(3)]:
        proc = subprocess.Popen([sys.executable, "-m", "doit"], cwd=project, env=clean_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.kill()
        proc.wait()
    proc = run_doit(project)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _assert_same_build(project, ref)


def test_a_failed_write_leaves_neither_the_file_nor_its_temporary(tmp_path):
    target = tmp_path / "a.json"
    with pytest.raises(RuntimeError):
        with atomic.atomic_path(target) as tmp:
            tmp.write_text("{half")
            raise RuntimeError("writer failed")
    assert list(tmp_path.iterdir()) == []
    atomic.write_json(target, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic.atomic_path(target, in_folder=True) as tmp:
            tmp.write_text("{half")
            raise RuntimeError("writer failed")
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"] and json.loads(target.read_text()) == {"a": 1}


def test_npz_archives_are_reproducible_and_loadable(tmp_path):
    arrays = {"0.weight": np.arange(6, dtype=np.int8).reshape(2, 3), "0.scale": np.array([0.5, 0.25])}
    atomic.save_npz(tmp_path / "a.npz", arrays)
    first = (tmp_path / "a.npz").read_bytes()
    time.sleep(2.1)  # zip timestamps have a 2-second resolution
    atomic.save_npz(tmp_path / "a.npz", arrays)
    assert (tmp_path / "a.npz").read_bytes() == first
    with np.load(tmp_path / "a.npz") as z:
        assert sorted(z.files) == sorted(arrays) and all(np.array_equal(z[k], v) for k, v in arrays.items())


def test_sweep_removes_what_killed_builds_left(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in (".a.json.partial-12", "sub/.m.mindir.partial-3.d/m.mindir", "sub/.atc.partial-d/model.om"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("half")
    (tmp_path / "sub" / "kept.json").write_text("{}")
    atomic.sweep(tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["sub", "sub/kept.json"]
