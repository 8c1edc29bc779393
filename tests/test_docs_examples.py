"""The Python examples of README.md and docs/*.md run as written.

An example is a fenced ```python block with ``<!-- runs in tests -->`` on the line before it (docs/index.md,
"Contributing to these pages").  Each runs on its own in a fresh copy of the demo project (its configuration,
shipped checkpoint and image folders) that also holds what the quick starts name: ``model.onnx`` (the trained demo
network as ONNX, the graph IR quantflow writes for it) and its images as ``calib/`` and ``eval/``.  quantflow.build
and quantflow.quantize are watched while it runs: the example must call one of them, every result it gets is the
demo's PASS with its report and artifacts on disk, and every error it meets is quantflow's own, naming the file.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from support.project import REPO, copy_project

import quantflow
from quantflow.errors import QuantflowError

MARK = "<!-- runs in tests -->"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def marked_blocks(path: Path) -> list[tuple[int, str]]:
    """(first code line, code) of every runnable block of one page; a mark not followed by a ```python fence, or a
    fence never closed, is an error naming the line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        where = f"{path.relative_to(REPO)}:{i + 1}"
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```python":
            raise AssertionError(f"{where}: {MARK} must be followed by a ```python block")
        try:
            end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
        except StopIteration:
            raise AssertionError(f"{where}: the ```python block is never closed") from None
        blocks.append((i + 3, "\n".join(lines[i + 2:end])))
    return blocks


EXAMPLES = [pytest.param(path, line, code, id=f"{path.relative_to(REPO)}:{line}")
            for path in PAGES for line, code in marked_blocks(path)]


# ------------------------------------------------------------------------------------------------ fast

def test_the_readme_quick_start_runs_both_functions():
    readme = [code for _, code in marked_blocks(REPO / "README.md")]
    assert any("quantflow.quantize(" in code for code in readme)
    assert any("quantflow.build(" in code for code in readme)


def test_every_python_block_of_the_docs_is_marked_runnable():
    """A Python example nobody runs goes stale: every ```python block carries the mark."""
    unmarked = []
    for path in PAGES:
        lines = path.read_text(encoding="utf-8").splitlines()
        unmarked += [f"{path.relative_to(REPO)}:{i + 1}" for i, line in enumerate(lines)
                     if line.strip() == "```python" and (i == 0 or lines[i - 1].strip() != MARK)]
    assert not unmarked


# ------------------------------------------------------------------------------------------------ the examples (slow)

@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """The demo project with model.onnx, calib/ and eval/ beside it (not built)."""
    from quantflow.tasks.graph import GRAPH_ONNX

    exported = copy_project(tmp_path_factory.mktemp("docs_export"))
    graph = quantflow.build(exported / "quantflow.toml", stages=["graph"])
    project = copy_project(tmp_path_factory.mktemp("docs_template"))
    shutil.copy(graph.artifacts["graph"] / GRAPH_ONNX, project / "model.onnx")
    shutil.copytree(project / "calib_data", project / "calib")
    shutil.copytree(project / "eval_data", project / "eval")
    return project


@pytest.mark.slow
@pytest.mark.parametrize("path,line,code", EXAMPLES)
def test_the_example_runs_as_written(path, line, code, template, tmp_path, monkeypatch):
    project = tmp_path / "project"
    shutil.copytree(template, project)
    monkeypatch.chdir(project)
    outcomes: list = []
    for name in ("build", "quantize"):
        monkeypatch.setattr(quantflow, name, _watched(getattr(quantflow, name), outcomes))

    exec(compile(code, f"{path.relative_to(REPO)}:{line}", "exec"), {"__name__": "__docs_example__"})

    assert outcomes, "the example calls neither quantflow.build nor quantflow.quantize"
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, QuantflowError), repr(outcome)
            assert re.search(r"[\w.-]+\.toml", str(outcome)), str(outcome)   # it names the configuration file
            continue
        assert outcome.passed and outcome.verdict == "PASS", str(outcome)
        assert outcome.config_file.resolve().is_relative_to(project.resolve())
        assert outcome.report_html.is_file()
        gate = outcome.artifacts["gate"]
        assert outcome.report == json.loads((gate / "accuracy_report.json").read_text())
        missing = {k: p for k, p in outcome.artifacts.items() if not p.exists()}
        assert not missing and outcome.artifacts["deploy_onnx"].is_file()


def _watched(function, outcomes: list):
    def watched(*args, **kwargs):
        try:
            result = function(*args, **kwargs)
        except BaseException as err:
            outcomes.append(err)
            raise
        outcomes.append(result)
        return result
    return watched
