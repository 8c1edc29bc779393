"""The artifact cache on S3: the S3 API served on 127.0.0.1 by moto's server mode (as s3fs's own tests do), reached
through s3fs with the endpoint and keys from the standard AWS environment, as MinIO, Huawei OBS or Ceph are.  The
scenarios are test_cache's; the last test builds the demo twice through one bucket (slow)."""
from __future__ import annotations

import json
import uuid

import pytest
from support.project import clean_env, copy_project, run_doit, task_lines
from test_cache import (check_prune, check_round_trip, check_tampered_entry_is_named_refused_and_replaced,
                        check_two_pushers_leave_one_whole_entry)

from quantflow.pipeline import cache as cache_mod
from quantflow.pipeline.cache import CACHE_ENV, ArtifactCache

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE",
         "AWS_SHARED_CREDENTIALS_FILE", CACHE_ENV)


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server on a free port of 127.0.0.1, for this module."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_url(s3_endpoint, monkeypatch):
    """A fresh bucket on the server, the AWS environment pointing at it; the cache URL under it."""
    import boto3

    for name in UNSET:
        monkeypatch.delenv(name, raising=False)
    for name, value in {**AWS_ENV, "AWS_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(name, value)
    cache_mod._refused.clear()
    bucket = f"qf-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/cache"


def test_round_trip(s3_url, tmp_path):
    check_round_trip(s3_url, tmp_path)


def test_a_tampered_entry_is_named_refused_and_replaced(s3_url, tmp_path, capsys):
    check_tampered_entry_is_named_refused_and_replaced(s3_url, tmp_path, capsys)


def test_two_pushers_of_one_key_leave_one_whole_entry(s3_url, tmp_path):
    check_two_pushers_leave_one_whole_entry(s3_url, tmp_path, rounds=2)


def test_prune(s3_url, tmp_path):
    check_prune(s3_url, tmp_path)


def test_an_unreachable_endpoint_is_a_warning(s3_url, tmp_path, monkeypatch, capsys):
    import socket
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "a.txt").write_text("a")
    assert ArtifactCache(s3_url).pull("graph", "0" * 16, tmp_path / "p") is False
    assert f"cannot read {s3_url}" in capsys.readouterr().err
    assert ArtifactCache(s3_url).push("graph", "0" * 16, tmp_path / "f") is False
    assert f"cannot write to {s3_url}" in capsys.readouterr().err


@pytest.mark.slow
def test_a_second_clone_pulls_every_keyed_stage_from_s3(s3_url, s3_endpoint, tmp_path):
    env = clean_env(**AWS_ENV, AWS_ENDPOINT_URL=s3_endpoint, QUANTFLOW_CACHE=s3_url)
    first, second = copy_project(tmp_path / "a"), copy_project(tmp_path / "b")
    proc = run_doit(first, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    keys = json.loads((first / "build" / "latest.json").read_text())["keys"]
    assert all(f"cache: {s} {k} pushed to {s3_url}" in proc.stdout for s, k in keys.items())
    proc = run_doit(second, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    latest = json.loads((second / "build" / "latest.json").read_text())
    assert latest["keys"] == keys
    assert all(f"cache: {s} {k} pulled from {s3_url}" in proc.stdout for s, k in keys.items())
    assert all(task_lines(proc.stdout)[s] == "ran" for s in keys)   # each "ran" as a pull: no work
    assert latest["gate"]["passed"] and "pushed" not in proc.stdout
