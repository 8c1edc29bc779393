"""The shared artifact cache (quantflow.pipeline.cache): which cache a build uses, push and pull with every file
checked, a tampered or half-pushed entry never taken, two pushers of one key, ``quantflow cache ls | verify |
prune``.  On a folder and on fsspec's in-memory file system here; on S3 (moto's server) in test_cache_s3.

The ``check_*`` scenarios take a cache URL, so that test_cache_s3 runs them on S3 too."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import threading
import uuid
from pathlib import Path

import pytest

from quantflow.cli import cache as cli
from quantflow.config import config_from_dict
from quantflow.errors import ConfigError, QuantflowError
from quantflow.io.atomic import PARTIAL
from quantflow.pipeline import cache as cache_mod
from quantflow.pipeline.cache import BLOBS, CACHE_ENV, GRACE_S, MANIFEST, ArtifactCache, choose, open_cache
from quantflow.pipeline.store import FolderStore

KEY = "0123456789abcdef"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """No $QUANTFLOW_CACHE from outside, and no entry remembered as damaged from another test."""
    monkeypatch.delenv(CACHE_ENV, raising=False)
    cache_mod._refused.clear()


@pytest.fixture(params=["folder", "memory"])
def url(request, tmp_path):
    return str(tmp_path / "cache") if request.param == "folder" else f"memory://qf-{uuid.uuid4().hex[:8]}/cache"


def artifact(folder: Path, seed: str = "a", n: int = 3) -> dict[str, bytes]:
    """An artifact folder as a stage leaves it: files (one in a sub-folder), its marker and a partial file."""
    files = {f"out{i}.bin": (seed * (i + 1) * 1000).encode() for i in range(n)}
    files["sub/table.json"] = json.dumps({"seed": seed}).encode()
    files["same.txt"] = b"same content in both"
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    (folder / ".stage.done").write_text("ok\n")                 # a build's own marker: not part of the entry
    (folder / f".x.json{PARTIAL}12").write_text("half")        # a killed write's leftover: not part of it
    return files


def contents(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and not p.name.startswith(".")}


# ----------------------------------------------------------------------------------------------- scenarios

def check_round_trip(url: str, tmp: Path) -> None:
    cache = ArtifactCache(url)
    assert cache.pull("graph", KEY, tmp / "miss") is False          # nothing there: a miss, nothing written
    assert not (tmp / "miss").exists()
    files = artifact(tmp / "built")
    assert cache.push("graph", KEY, tmp / "built") is True
    assert cache.push("graph", KEY, tmp / "built") is False         # a sound entry stays as it is
    target = tmp / "pulled"
    target.mkdir()
    (target / "stale.txt").write_text("left by an unfinished run")  # not in the entry: removed by the pull
    assert ArtifactCache(url).pull("graph", KEY, target) is True
    assert contents(target) == files
    assert not [p for p in target.parent.iterdir() if PARTIAL in p.name]   # the download folder is gone
    [entry] = cache.entries(read_manifests=True)
    assert (entry.stage, entry.key, entry.complete, entry.files) == ("graph", KEY, True, len(files))
    assert cache.verify(entry) is None


def check_tampered_entry_is_named_refused_and_replaced(url: str, tmp: Path, capsys) -> None:
    cache = ArtifactCache(url)
    files = artifact(tmp / "built")
    cache.push("calibrate", KEY, tmp / "built")
    digest = hashlib.sha256(files["out1.bin"]).hexdigest()
    cache.store.write(f"calibrate/{KEY}/{BLOBS}/{digest}", b"tampered" + files["out1.bin"][8:])
    capsys.readouterr()
    assert ArtifactCache(url).pull("calibrate", KEY, tmp / "p1") is False
    err = capsys.readouterr().err
    assert "out1.bin does not match its manifest" in err and f"calibrate/{KEY}" in err and url.rstrip("/") in err
    assert not (tmp / "p1" / "out0.bin").exists()                    # nothing of the entry taken
    [entry] = cache.entries()
    assert "out1.bin does not match its manifest" in cache.verify(entry)
    # remembered for the process: not pulled again
    assert ArtifactCache(url).pull("calibrate", KEY, tmp / "p2") is False
    assert "warning" not in capsys.readouterr().err
    # the stage ran again here; its push replaces the damaged entry, which is then pulled whole
    assert ArtifactCache(url).push("calibrate", KEY, tmp / "built") is True
    assert ArtifactCache(url).pull("calibrate", KEY, tmp / "p3") is True
    assert contents(tmp / "p3") == files


def check_two_pushers_leave_one_whole_entry(url: str, tmp: Path, rounds: int = 3) -> None:
    sets = {s: artifact(tmp / s, seed=s, n=8) for s in ("x", "y")}
    for r in range(rounds):
        cache_mod._refused.clear()
        ArtifactCache(url).store.remove([i.path for i in ArtifactCache(url).store.walk()])
        start = threading.Barrier(2)
        results = {}

        def push(s: str) -> None:
            c = ArtifactCache(url)
            start.wait()
            results[s] = c.push("gate", KEY, tmp / s)

        threads = [threading.Thread(target=push, args=(s,)) for s in sets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert any(results.values()), results
        assert ArtifactCache(url).pull("gate", KEY, tmp / f"pulled{r}") is True
        assert contents(tmp / f"pulled{r}") in list(sets.values())    # one pusher's whole set, never a mix
        [entry] = ArtifactCache(url).entries()
        assert ArtifactCache(url).verify(entry) is None


def check_prune(url: str, tmp: Path) -> None:
    cache = ArtifactCache(url)
    for i, stage in enumerate(("graph", "calibrate", "gate")):
        artifact(tmp / stage, seed=stage, n=i + 1)
        cache.push(stage, KEY, tmp / stage)
    ordered = cache.entries()                                       # least recently used first
    now = max(e.mtime for e in ordered)
    assert cache.prune(older_than_days=2, max_size=None, now=now) == []   # nothing is 2 days old yet
    later = now + 3 * 86400
    removed = cache.prune(older_than_days=None, max_size=sum(e.size for e in ordered[1:]), now=later)
    assert [e.prefix for e in removed] == [ordered[0].prefix]       # the least recently used, down to SIZE
    assert [e.prefix for e in cache.entries()] == [e.prefix for e in ordered[1:]]
    assert {e.prefix for e in cache.prune(older_than_days=2, max_size=None, now=later)} == \
        {e.prefix for e in ordered[1:]}
    assert cache.entries() == []


# ----------------------------------------------------------------------------------------------- folder, memory

def test_round_trip(url, tmp_path):
    check_round_trip(url, tmp_path)


def test_a_tampered_entry_is_named_refused_and_replaced(url, tmp_path, capsys):
    check_tampered_entry_is_named_refused_and_replaced(url, tmp_path, capsys)


def test_two_pushers_of_one_key_leave_one_whole_entry(url, tmp_path):
    check_two_pushers_leave_one_whole_entry(url, tmp_path)


def test_prune_removes_old_entries_then_the_least_recently_used(url, tmp_path):
    check_prune(url, tmp_path)


def test_a_missing_file_or_a_bad_manifest_is_named_and_refused(url, tmp_path, capsys):
    cache = ArtifactCache(url)
    files = artifact(tmp_path / "built")
    cache.push("graph", KEY, tmp_path / "built")
    cache.store.remove([f"graph/{KEY}/{BLOBS}/{hashlib.sha256(files['sub/table.json']).hexdigest()}"])
    assert cache.pull("graph", KEY, tmp_path / "p") is False
    assert f"the entry graph/{KEY} in {cache.url} is damaged: its file sub/table.json is missing" in \
        capsys.readouterr().err
    for manifest in (b"{not json", json.dumps({"format": 1, "files": {"../../etc/x": {"sha256": "0" * 64,
                                                                                      "size": 1}}}).encode()):
        cache.store.write(f"aipp/{KEY}/{MANIFEST}", manifest)
        assert ArtifactCache(url).pull("aipp", KEY, tmp_path / "q") is False
        assert "damaged manifest" in capsys.readouterr().err
        cache_mod._refused.clear()
    assert not (tmp_path / "q").exists() and not (tmp_path.parent / "etc").exists()


def test_a_push_killed_before_its_manifest_leaves_no_entry(url, tmp_path):
    cache = ArtifactCache(url)
    artifact(tmp_path / "built")
    real = cache.store.write

    def killed(path, data):
        if path.endswith(MANIFEST):
            raise KeyboardInterrupt   # the process stops between its last blob and its manifest
        real(path, data)

    cache.store.write = killed
    with pytest.raises(KeyboardInterrupt):
        cache.push("export", KEY, tmp_path / "built")
    assert ArtifactCache(url).pull("export", KEY, tmp_path / "p") is False and not (tmp_path / "p").exists()
    [entry] = ArtifactCache(url).entries()
    assert not entry.complete
    assert ArtifactCache(url).prune(older_than_days=None, max_size=None, now=entry.mtime + GRACE_S / 2) == []
    assert ArtifactCache(url).entries()                               # a push may still be under way
    ArtifactCache(url).prune(older_than_days=None, max_size=None, now=entry.mtime + 2 * GRACE_S)
    assert ArtifactCache(url).entries() == []


def test_a_pull_interrupted_half_way_leaves_nothing_in_the_folder(url, tmp_path):
    cache = ArtifactCache(url)
    artifact(tmp_path / "built")
    cache.push("recover", KEY, tmp_path / "built")
    real, calls = cache.store.get, []

    def dies(path, local):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(path, local)

    cache.store.get = dies
    (tmp_path / "stage").mkdir()
    with pytest.raises(KeyboardInterrupt):
        cache.pull("recover", KEY, tmp_path / "stage" / KEY)
    assert list((tmp_path / "stage").iterdir()) == []


def test_an_entry_ages_from_its_last_push_or_pull(tmp_path):
    cache = ArtifactCache(str(tmp_path / "c"))
    for stage in ("graph", "gate"):
        artifact(tmp_path / stage, seed=stage)
        cache.push(stage, KEY, tmp_path / stage)
        os.utime(tmp_path / "c" / stage / KEY / MANIFEST, (1e9, 1e9))   # pushed in 2001
    assert cache.pull("gate", KEY, tmp_path / "pulled") is True        # used now
    assert [e.stage for e in cache.entries()] == ["graph", "gate"]
    assert [e.stage for e in cache.prune(older_than_days=1, max_size=None)] == ["graph"]


def test_removal_takes_the_manifest_first(tmp_path):
    cache = ArtifactCache(str(tmp_path / "c"))
    artifact(tmp_path / "built")
    cache.push("graph", KEY, tmp_path / "built")
    order = []
    real = cache.store.remove
    cache.store.remove = lambda paths: (order.append(list(paths)), real(paths))
    cache.remove(cache.entries()[0])
    assert order[0] == [f"graph/{KEY}/{MANIFEST}"] and all(MANIFEST not in p for p in order[1])
    assert not (tmp_path / "c" / "graph").exists()                    # no empty folders left


def test_an_unreachable_cache_is_a_warning(tmp_path, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    cache = ArtifactCache(str(blocker))
    artifact(tmp_path / "built")
    assert cache.pull("graph", KEY, tmp_path / "p") is False
    assert f"cannot read {blocker}" in capsys.readouterr().err
    assert cache.push("graph", KEY, tmp_path / "built") is False     # not tried again in this build
    writable_only = ArtifactCache(str(blocker))
    writable_only.readable = True
    writable_only.store.read = lambda path: (_ for _ in ()).throw(FileNotFoundError(path))
    assert writable_only.push("graph", KEY, tmp_path / "built") is False
    assert f"cannot write to {blocker}" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- which cache

def _cfg(tmp_path: Path, url: str | None):
    from support.project import REPO
    from quantflow.config import load_config
    data = load_config(REPO / "quantflow.toml").model_dump(mode="json")
    data["cache"] = {"url": url}
    for section in ("train", "retrain"):
        if data.get(section) is None:
            data.pop(section, None)
    return config_from_dict(data, root=tmp_path)


def test_which_cache_a_build_uses(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path, "shared/cache")
    assert choose(None, cfg) == (str(tmp_path / "shared" / "cache"), "cache.url")   # relative to the config
    assert choose(None, _cfg(tmp_path, "s3://b/p")) == ("s3://b/p", "cache.url")
    monkeypatch.setenv(CACHE_ENV, "/mnt/env-cache")
    assert choose(None, cfg) == ("/mnt/env-cache", f"${CACHE_ENV}")
    assert choose("s3://bucket/x", cfg) == ("s3://bucket/x", "--cache")
    assert choose(tmp_path / "p", cfg) == (str(tmp_path / "p"), "--cache")
    assert choose(False, cfg) is None
    monkeypatch.setenv(CACHE_ENV, "off")
    assert choose(None, cfg) is None and choose("s3://b/p", cfg) is not None
    monkeypatch.delenv(CACHE_ENV)
    assert choose(None, _cfg(tmp_path, None)) is None and choose(None) is None


def test_a_malformed_url_is_a_config_error_naming_the_field(tmp_path):
    cfg = _cfg(tmp_path, "nosuchscheme://bucket/prefix")
    with pytest.raises(ConfigError, match=r"quantflow.toml: cache.url 'nosuchscheme://bucket/prefix' is not a "):
        open_cache(None, cfg, tmp_path / "quantflow.toml")
    with pytest.raises(ConfigError, match=r"--cache 's3://' is not a folder or fsspec URL"):
        open_cache("s3://")
    assert isinstance(open_cache(None, _cfg(tmp_path, "s3://bucket/prefix")), ArtifactCache)   # nothing contacted
    assert open_cache(False, cfg) is None


def test_open_build_carries_the_cache(tmp_path, monkeypatch):
    from support.project import tiny_project

    from quantflow.pipeline.build import open_build
    project = tiny_project(tmp_path / "p")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env-cache"))
    assert open_build(project / "quantflow.toml").cache.url == str(tmp_path / "env-cache")
    assert open_build(project / "quantflow.toml", cache=False).cache is None
    assert open_build(project / "quantflow.toml", cache=str(tmp_path / "c")).cache.url == str(tmp_path / "c")


# ----------------------------------------------------------------------------------------------- quantflow cache

def _run(*argv: str) -> int:
    ap = argparse.ArgumentParser(prog="quantflow cache")
    cli.add_arguments(ap)
    return cli.run(ap.parse_args(list(argv)))


def test_cli_ls_verify_prune(tmp_path, capsys):
    url = str(tmp_path / "cache")
    cache = ArtifactCache(url)
    for stage in ("graph", "gate"):
        artifact(tmp_path / stage, seed=stage)
        cache.push(stage, KEY, tmp_path / stage)
    capsys.readouterr()
    assert _run("ls", "--cache", url) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["STAGE", "KEY", "SIZE", "AGE", "FILES"]
    assert {tuple(line.split()[:2]) + (line.split()[-1],) for line in out[1:3]} == {("graph", KEY, "5"),
                                                                                   ("gate", KEY, "5")}
    assert out[3].startswith("2 entries")
    assert _run("verify", "--cache", url) == 0
    blob = next((tmp_path / "cache" / "gate" / KEY / BLOBS).iterdir())
    blob.write_bytes(b"changed")
    assert _run("verify", "--cache", url) == 1
    out = capsys.readouterr().out
    assert f"ok   graph {KEY}" in out and f"BAD  gate {KEY}: the entry gate/{KEY}" in out and "does not match" in out
    os.utime(tmp_path / "cache" / "graph" / KEY / MANIFEST, (1, 1))   # graph last used long ago
    assert _run("prune", "--cache", url, "--older-than", "30") == 0
    assert f"removed graph {KEY}" in capsys.readouterr().out
    assert [e.stage for e in cache.entries()] == ["gate"]
    assert _run("prune", "--cache", url, "--max-size", "0") == 0 and cache.entries() == []


def test_cli_finds_the_cache_like_a_build_and_says_what_is_wrong(tmp_path, monkeypatch, capsys):
    from support.project import tiny_project
    project = tiny_project(tmp_path / "p")
    config = project / "quantflow.toml"
    assert _run("ls", str(config)) == 2
    assert "no artifact cache to look at" in capsys.readouterr().err
    config.write_text(config.read_text() + '\n[cache]\nurl = "../shared"\n')
    assert _run("ls", str(config)) == 0
    assert f"0 entries, 0 B in {tmp_path / 'shared'}" in capsys.readouterr().out
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env"))
    assert _run("ls", str(tmp_path / "no-such.toml")) == 0             # the environment's: no config needed
    assert str(tmp_path / "env") in capsys.readouterr().out
    for argv, says in ((["prune"], "give --older-than DAYS, --max-size SIZE or both"),
                       (["prune", "--max-size", "lots"], "--max-size 'lots': give a size such as 500M or 2G"),
                       (["prune", "--older-than", "-1"], "--older-than -1: give a number of days"),
                       (["ls", "--cache", "nosuch://x/y"], "--cache 'nosuch://x/y' is not a folder or fsspec URL")):
        assert _run(*argv) == 2
        assert says in capsys.readouterr().err


def test_parse_size():
    assert [cli.parse_size(s) for s in ("500M", "2G", "1.5GB", "800KiB", "1000", "0")] == \
        [500 * 2 ** 20, 2 * 2 ** 30, int(1.5 * 2 ** 30), 800 * 1024, 1000, 0]
    with pytest.raises(QuantflowError):
        cli.parse_size("2 parsecs")


def test_a_folder_store_write_is_whole_or_absent(tmp_path):
    store = FolderStore(tmp_path)
    store.write("a/b.json", b"1")
    store.write("a/b.json", b"22")
    assert store.read("a/b.json") == b"22" and [i.path for i in store.walk()] == ["a/b.json"]


def test_the_benchmark_table_and_arguments():
    from benchmarks import cache as bench

    rounds = [{"cold": {"wall_s": 10.0, "cpu_s": 8.0}, "push": {"wall_s": 11.0, "cpu_s": 8.5},
               "warm": {"wall_s": 3.0, "cpu_s": 2.0}, "pulled": "8/8", "same_keys": True, "same_verdict": True},
              {"cold": {"wall_s": 12.0, "cpu_s": 9.0}, "push": {"wall_s": 12.5, "cpu_s": 9.0},
               "warm": {"wall_s": 4.0, "cpu_s": 2.2}, "pulled": "8/8", "same_keys": True, "same_verdict": True}]
    table = bench.format_table(rounds).splitlines()
    assert table[2] == "| cold, no cache | 11.0 (10.0-12.0) | 8.5 (8.0-9.0) | 1 |"
    assert table[4] == "| warm, from the cache | 3.5 (3.0-4.0) | 2.1 (2.0-2.2) | 0.32 (0.30-0.33) |"
    assert table[5] == "| cache overhead: pushing - cold | 0.8 (0.5-1.0) | | |"
    for r, t in zip(rounds, (0.05, 0.07)):
        r["direct"] = {"push_s": t, "pull_s": 2 * t, "bytes": 2 ** 21}
    table = bench.format_table(rounds).splitlines()
    assert table[6] == "| cache overhead: push of the keyed folders (2.0 MB), timed alone | 0.06 (0.05-0.07) | | |"
    assert table[7] == "| cache overhead: pull of the keyed folders (2.0 MB), timed alone | 0.12 (0.10-0.14) | | |"
    assert table[-1] == "2 round(s): warm pulled 8/8 keyed stages, same keys yes, same verdict yes"
    assert bench.parse_args(["--repeat", "2", "--cache-url", "s3://b/p"]).cache_url == "s3://b/p"
    with pytest.raises(SystemExit):
        bench.parse_args(["--repeat", "0"])


def test_what_a_key_hashes_does_not_depend_on_where_the_project_sits(tmp_path):
    from quantflow.pipeline.keys import json_digest, portable

    def manifest(clone: Path) -> dict:   # the sampler's record of images outside the configuration's folder
        return {"data_dir": str(clone / "calib_data"), "count": 2,
                "images": [{"path": str(clone / "calib_data" / "0" / "a.png"), "sha256": "ab", "label": 0},
                           {"path": "inside/b.png", "sha256": "cd", "label": 1}]}

    a, b = tmp_path / "a", tmp_path / "elsewhere" / "b"
    pa, pb = portable(manifest(a), a / "examples" / "m"), portable(manifest(b), b / "examples" / "m")
    assert pa == pb and [i["path"] for i in pa["images"]] == ["../../calib_data/0/a.png", "inside/b.png"]
    assert json_digest(pa) == json_digest(pb) != json_digest(portable(manifest(a), a))


def test_a_build_pulls_a_stage_only_where_it_stands_here(tmp_path, capsys):
    from quantflow.pipeline.build import Build
    from quantflow.tasks.stage import Stage, done_marker

    class At(Build):   # a build whose keys and folders are fixed (no configuration, no sample)
        def key(self, name):
            return KEY

        def dir(self, name, create=True):
            return tmp_path / "out" / name / KEY

    cache = ArtifactCache(str(tmp_path / "c"))
    files = artifact(tmp_path / "built")
    cache.push("atc", KEY, tmp_path / "built")
    b = At(None, cache=cache)
    stands = Stage(name="atc", doc="", run=lambda b: None)
    not_here = Stage(name="atc", doc="", run=lambda b: None, uptodate=lambda b: False)   # e.g. another atc here
    assert b.pull(not_here) is False
    assert f"cache: atc {KEY} in {cache.url} does not stand on this machine" in capsys.readouterr().out
    b.rebuild = {"atc"}                                                 # quantflow build --always
    assert b.pull(stands) is False
    b.rebuild = set()
    assert b.pull(stands) is True and contents(b.dir("atc")) == files
    assert f"cache: atc {KEY} pulled from {cache.url}" in capsys.readouterr().out
    done_marker(b.dir("atc"), "atc").write_text("ok\n")
    assert b.pull(stands) is False                                      # done here: nothing to pull
    assert At(None).pull(stands) is False                               # no cache
