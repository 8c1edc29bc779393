"""Shared fixtures: a copy of the shipped demo project, built once with `doit` for the session."""
from __future__ import annotations

import pytest
from support.project import copy_project, run_doit


@pytest.fixture(scope="session")
def built_demo(tmp_path_factory):
    """The demo project after a first, full `doit` run: (project dir, completed process)."""
    project = copy_project(tmp_path_factory.mktemp("demo"))
    proc = run_doit(project)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return project, proc


@pytest.fixture(scope="session")
def demo_cfg(built_demo):
    from quantflow.config import load_config
    return load_config(built_demo[0] / "quantflow.toml")


@pytest.fixture(scope="session")
def demo_net(demo_cfg):
    import mindspore as ms

    from quantflow.frontends.network import build_network
    ms.set_context(mode=ms.PYNATIVE_MODE)
    return build_network(demo_cfg)
