"""The artifact cache end to end on the shipped demo: a second clone in another folder pulls every keyed stage that
a first one pushed (the same keys, the same verdict, its latest.json naming its own folder); a tampered cached file
is named, refused and rebuilt, and the rebuild replaces the entry; no build writes a pickle."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from support.project import clean_env, copy_project, run_doit, run_quantflow, task_lines

from quantflow.pipeline.cache import BLOBS, CACHE_ENV, MANIFEST, ArtifactCache

pytestmark = pytest.mark.slow


def is_pickle(path: Path) -> bool:
    """A pickle, or an .npy / .npz that holds one (object arrays)."""
    data = path.read_bytes()[:2]
    if path.suffix in (".pkl", ".pickle") or (len(data) == 2 and data[0] == 0x80 and 2 <= data[1] <= 5):
        return True
    if path.suffix in (".npz", ".npy"):
        try:
            with np.load(path, allow_pickle=False) as z:
                for name in getattr(z, "files", []):
                    z[name]
            return False
        except (ValueError, zipfile.BadZipFile):
            return True
    return False


def _latest(project: Path) -> dict:
    return json.loads((project / "build" / "latest.json").read_text())


def _paths(value):
    """Every absolute path string in latest.json."""
    if isinstance(value, dict):
        for v in value.values():
            yield from _paths(v)
    elif isinstance(value, str) and value.startswith("/"):
        yield value


def test_a_second_clone_pulls_every_keyed_stage_and_a_tampered_file_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    cache = str(tmp_path / "shared-cache")
    first, second, third = (copy_project(tmp_path / name) for name in ("first", "second", "third"))

    proc = run_doit(first, env=clean_env(**{CACHE_ENV: cache}))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    keys = _latest(first)["keys"]
    assert keys and all(f"cache: {s} {k} pushed to {cache}" in proc.stdout for s, k in keys.items())

    # a fresh clone in another folder, through the command line's --cache
    proc = run_quantflow(second, "build", "--cache", cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    latest = _latest(second)
    assert latest["keys"] == keys
    assert all(f"cache: {s} {k} pulled from {cache}" in proc.stdout for s, k in keys.items())
    assert "pushed" not in proc.stdout and "warning" not in proc.stderr
    assert latest["gate"] == _latest(first)["gate"]
    assert all(Path(p).is_relative_to(second) for p in _paths(latest)), latest   # its own folder, not the first's
    for stage, folder in latest["artifacts"].items():
        assert (Path(folder) / f".{stage}.done").is_file() and Path(folder).name == keys[stage]

    # a cached file changed: named, refused, the stage rebuilt, its push replaces the entry
    manifest = json.loads((Path(cache) / "gate" / keys["gate"] / MANIFEST).read_text())
    blob = Path(cache) / "gate" / keys["gate"] / BLOBS / manifest["files"]["accuracy_report.json"]["sha256"]
    blob.write_text(blob.read_text().replace('"passed": true', '"passed": false'))
    proc = run_doit(third, env=clean_env(**{CACHE_ENV: cache}))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (f"the entry gate/{keys['gate']} in {cache} is damaged: its file accuracy_report.json does not match "
            f"its manifest") in proc.stderr
    assert f"cache: gate {keys['gate']} pulled" not in proc.stdout
    assert "accuracy gate: PASS" in proc.stdout and f"cache: gate {keys['gate']} pushed to {cache}" in proc.stdout
    assert all(f"cache: {s} {k} pulled from {cache}" in proc.stdout for s, k in keys.items() if s != "gate")
    assert task_lines(proc.stdout)["summary"] == "ran" and _latest(third)["gate"] == latest["gate"]
    shared = ArtifactCache(cache)
    assert [shared.verify(e) for e in shared.entries()] == [None] * len(keys)

    built = [p for project in (first, second, third) for p in (project / "build").rglob("*") if p.is_file()]
    assert len(built) > 3 * len(keys) and not [p for p in built if is_pickle(p)]
