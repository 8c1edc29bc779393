"""Builds across a Ray cluster (quantflow.pipeline.farm): what is refused before anything runs (no Ray needed), and
two demo builds as tasks of a local Ray runtime through a folder cache, pulled into the driver's own copies."""
from __future__ import annotations

import builtins
import json
import os
import shutil
from pathlib import Path

import pytest
from support.project import REPO, copy_project

from quantflow.errors import ConfigError, QuantflowError
from quantflow.io.digest import file_sha256
from quantflow.pipeline import farm
from quantflow.pipeline.cache import ArtifactCache
from quantflow.tasks.stage import done_marker


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A copy of the demo project, not built."""
    return copy_project(tmp_path_factory.mktemp("farm_project"))


def _no_ray():
    raise AssertionError("Ray was started for builds that should have been refused")


def test_a_remote_address_without_a_cache_is_refused_before_ray_starts(project, monkeypatch):
    monkeypatch.delenv(farm.CACHE_ENV, raising=False)
    monkeypatch.setattr(farm, "_ray", _no_ray)
    config = project / "quantflow.toml"
    for address in ("auto", "ray://head:10001"):
        with pytest.raises(QuantflowError, match=r"quantflow.toml: building on the Ray cluster at '[^']+' needs an "
                                                 r"artifact cache, through which workers on other machines hand back"):
            farm.build_on_ray([config], address, None, [], False)
    monkeypatch.setenv(farm.CACHE_ENV, str(project / "cache"))
    with pytest.raises(QuantflowError, match=r"needs an artifact cache.*, not --no-cache"):
        farm.build_on_ray([config], "auto", False, [], False)
    with pytest.raises(QuantflowError, match="needs an artifact cache"):   # a forced pull needs one on `local` too
        farm.build_on_ray([config], "local", False, [], False, pull=True)
    with pytest.raises(ConfigError, match=r"--cache 'nosuch://bucket/prefix' is not a folder or fsspec URL"):
        farm.build_on_ray([config], "auto", "nosuch://bucket/prefix", [], False)


def test_two_configs_building_into_one_folder_are_refused(project, monkeypatch):
    monkeypatch.setattr(farm, "_ray", _no_ray)
    other = project / "other.toml"
    other.write_text((project / "quantflow.toml").read_text())
    with pytest.raises(QuantflowError, match=r"quantflow.toml and .*other.toml both build into .*build: give them "
                                             r"different build.output_dir"):
        farm.build_on_ray([project / "quantflow.toml", other], "local", None, [], False)


def test_a_build_elsewhere_is_given_the_cache_this_one_resolves(project, monkeypatch, tmp_path):
    config = project / "quantflow.toml"
    monkeypatch.delenv(farm.CACHE_ENV, raising=False)
    assert farm.cache_args(config, False) == (["--no-cache"], None)
    assert farm.cache_args(config, None) == (["--no-cache"], None)   # not the worker's own $QUANTFLOW_CACHE
    assert farm.cache_args(config, "s3://bucket/prefix") == (["--cache", "s3://bucket/prefix"], "s3://bucket/prefix")
    monkeypatch.chdir(tmp_path)   # a folder is made absolute: the worker starts in another folder
    assert farm.cache_args(config, "cache") == (["--cache", str(tmp_path / "cache")], str(tmp_path / "cache"))
    monkeypatch.setenv(farm.CACHE_ENV, "env_cache")
    assert farm.cache_args(config, None) == (["--cache", str(tmp_path / "env_cache")], str(tmp_path / "env_cache"))
    monkeypatch.setenv(farm.CACHE_ENV, "off")
    assert farm.cache_args(config, None) == (["--no-cache"], None)
    monkeypatch.delenv(farm.CACHE_ENV)
    for url, given in (("s3://bucket/demo", "s3://bucket/demo"), ("shared", str(project / "shared"))):
        with_url = project / "with_url.toml"   # [cache] url; a folder is read against the configuration's folder
        with_url.write_text((project / "quantflow.toml").read_text() + f'\n[cache]\nurl = "{url}"\n')
        assert farm.cache_args(with_url, None) == (["--cache", given], given)


def test_a_missing_ray_is_reported_with_the_extra(project, monkeypatch):
    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ConfigError, match=r"--ray needs Ray: pip install 'quantflow-ascend\[ray\]' \(the ray extra\)"):
        farm.build_on_ray([project / "quantflow.toml"], "local", None, [], False)


def test_a_cluster_that_cannot_be_joined_is_named():
    class Unreachable:
        def is_initialized(self):
            return False

        def init(self, address, **kwargs):
            raise ConnectionError("Could not find any running Ray instance.")

    with pytest.raises(QuantflowError, match=r"--ray 'auto': cannot join the Ray cluster: ConnectionError: Could not "
                                             r"find any running Ray instance"):
        farm._start(Unreachable(), "auto")


def test_the_driver_finds_which_stages_a_worker_did_not_hand_back(tmp_path):
    cache = ArtifactCache(str(tmp_path / "cache"))
    (tmp_path / "graph").mkdir()
    (tmp_path / "graph" / "graph.onnx").write_bytes(b"onnx")
    assert cache.push("graph", "k1", tmp_path / "graph")
    assert farm._unpushed(cache, {"graph": "k1", "calibrate": "k2"}) == ["calibrate"]
    (tmp_path / "cache" / "graph" / "k1" / "manifest.json").write_text("{")   # a damaged entry is no entry
    assert farm._unpushed(cache, {"graph": "k1"}) == ["graph"]


# ----------------------------------------------------------------------------- on a local Ray runtime

@pytest.fixture(scope="module")
def local_ray():
    """A local Ray runtime started as ``build_on_ray(..., "local", ...)`` starts one, shut down after this module's
    tests; its workers' builds import quantflow from this tree and see no CANN toolkit (as support.project's builds
    do).  Ray is in the test extra: a missing one fails, it is not skipped."""
    import ray
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        for name in [k for k in os.environ if k.startswith("ASCEND")]:
            mp.delenv(name)
        ray.shutdown()   # a runtime another module left up has not this environment
        assert farm._start(ray, "local")
        yield ray
        ray.shutdown()


def _calibration_seed(project: Path, seed: int) -> None:
    config = project / "quantflow.toml"
    text = config.read_text()
    assert 'seed = 0\nmethod = "mse"' in text
    config.write_text(text.replace('seed = 0\nmethod = "mse"', f'seed = {seed}\nmethod = "mse"'))


def _latest(project: Path) -> dict:
    return json.loads((project / "build" / "latest.json").read_text())


@pytest.mark.slow
def test_configs_build_as_ray_tasks_and_the_driver_pulls_them_through_the_cache(local_ray, tmp_path, capsys):
    """Each config is built by a Ray task in a worker-side copy of its project and pulled, as from a remote
    worker, into the driver-side copy through a folder cache; a third config, whose build fails on its worker
    (no calibration images), is reported and not pulled."""
    cache = tmp_path / "cache"
    workers = [copy_project(tmp_path / "worker" / name) for name in ("a", "b", "broken")]
    drivers = [copy_project(tmp_path / "driver" / name) for name in ("a", "b", "broken")]
    for project in (workers[1], drivers[1]):   # another calibration sample: other keys for every keyed stage
        _calibration_seed(project, 1)
    shutil.rmtree(workers[2] / "calib_data")
    (workers[2] / "calib_data").mkdir()
    worker_of = {d / "quantflow.toml": w / "quantflow.toml" for d, w in zip(drivers, workers)}

    code = farm.build_on_ray(list(worker_of), "local", str(cache), [], False, pull=True,
                             worker_path=worker_of.__getitem__)

    keys = []
    for worker, driver in zip(workers[:2], drivers[:2]):
        built, pulled = _latest(worker), _latest(driver)
        assert built["gate"]["passed"] and pulled["gate"]["passed"]
        assert pulled["keys"] == built["keys"] and len(built["keys"]) >= 8
        keys.append(built["keys"])
        for stage, key in built["keys"].items():
            entry = cache / stage / key
            manifest = json.loads((entry / "manifest.json").read_text())   # pushed by the worker's build
            assert (entry / "used").is_file()                             # pulled by the driver's
            folder = Path(pulled["artifacts"][stage])
            assert folder.is_relative_to(driver / "build") and done_marker(folder, stage).is_file()
            assert manifest["files"] and {rel: file_sha256(folder / rel) for rel in manifest["files"]} == {
                rel: f["sha256"] for rel, f in manifest["files"].items()}
    assert not set(keys[0].values()) & set(keys[1].values())
    assert not (workers[2] / "build" / "latest.json").exists() and not (drivers[2] / "build").exists()
    assert code == 1
    out = capsys.readouterr().out
    assert sorted(line for line in out.splitlines() if line.startswith("===== ")) == sorted(
        [f"===== {d / 'quantflow.toml'}: built" for d in drivers[:2]]
        + [f"===== {drivers[2] / 'quantflow.toml'}: FAILED (exit 1)"])
    assert out.count("----- pulled into ") == 2 and out.count("----- not pulled into ") == 1
