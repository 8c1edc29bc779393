"""Shared fixtures (the shipped demo project, as a copy; and built once with `doit` for the session), and the test
tiers.

`pytest -m "not slow"` is the quick loop.  Slow, marked here rather than in each file: every test that uses a
fixture building a project end to end (``SLOW_FIXTURES``: the built demo, and the module fixture that builds
another project), the end-to-end modules (``SLOW_MODULES``: demo and zoo builds, killed builds, the benchmark)
and single end-to-end tests of otherwise quick modules (``SLOW_TESTS``).  A test may also carry
``@pytest.mark.slow`` itself.
"""
from __future__ import annotations

import pytest
from support.project import copy_project, run_doit

# fixtures that run a whole build (a test using one, directly or through another fixture, is slow)
SLOW_FIXTURES = {
    "built_demo",   # this file: the demo project built by `doit`
    "tiny",         # test_cli: a folder with only a config, an ONNX model and images, built by `quantflow build`
    "built_two_input",   # test_extra_inputs: the two-input detector's project, built
}
# modules whose every test builds, kills or trains end to end
SLOW_MODULES = {
    "test_pipeline_e2e", "test_demo_mbv2", "test_fallback", "test_kill", "test_zoo", "test_onnx_pipeline",
    "test_bench", "test_release_gate_build", "test_recovery_example", "test_retrain_example",
}
# single end-to-end tests in modules that are otherwise quick ("module::test")
SLOW_TESTS = {
    "test_detector::test_a_detector_project_is_gated_on_every_output",  # three `quantflow build` runs
    "test_methods::test_zoo_comparison_reports_every_method",           # a zoo network, every range method
    "test_suppression::test_a_detector_with_its_suppression_builds_as_init_writes_it",
    "test_extra_inputs::test_batch_sizes_free_every_input_and_name_each_at_the_batch_for_atc",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rpartition(".")[2] if item.module else ""
        if (module in SLOW_MODULES or f"{module}::{getattr(item, 'originalname', item.name)}" in SLOW_TESTS
                or SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def demo_project(tmp_path_factory):
    """A copy of the shipped demo project (configuration, shipped checkpoint, images), not built."""
    return copy_project(tmp_path_factory.mktemp("demo_project"))


@pytest.fixture(scope="session")
def built_demo(tmp_path_factory):
    """The demo project after a first, full `doit` run: (project dir, completed process)."""
    project = copy_project(tmp_path_factory.mktemp("demo"))
    proc = run_doit(project)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return project, proc


@pytest.fixture(scope="session")
def demo_cfg(demo_project):
    """The demo's configuration (its folders in the copy of ``demo_project``)."""
    from quantflow.config import load_config
    return load_config(demo_project / "quantflow.toml")


@pytest.fixture(scope="session")
def demo_net(demo_cfg):
    import mindspore as ms

    from quantflow.frontends.network import build_network
    ms.set_context(mode=ms.PYNATIVE_MODE)
    return build_network(demo_cfg)
