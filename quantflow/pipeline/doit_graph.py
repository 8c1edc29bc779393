r"""The doit task graph, made from the stage table (``quantflow.tasks.STAGES``) and shipped with the package: a
model repo needs only its quantflow.toml, and ``quantflow build`` (``namespace(config)``) or a three-line dodo.py
runs it::

    from quantflow.pipeline.doit_graph import *  # noqa: F401,F403  (the task_* functions)
    from quantflow.pipeline.doit_graph import doit_config
    DOIT_CONFIG = doit_config()   # `doit config=FILE` (default quantflow.toml) chooses the configuration

One ``task_<stage>`` per stage.  Unkeyed stages are tracked by doit (their file dependencies, targets and
``config_changed`` state); keyed stages are created once ``sample`` has run (their keys hash its manifest) and
are up to date exactly when their outputs and completion marker exist under their current key.  With an
artifact cache (quantflow.pipeline.cache), a keyed stage that is not up to date is first pulled from it under its
key (its work skipped) and, once completed here, pushed to it.
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from doit import create_after, get_var
from doit.exceptions import TaskError, TaskFailed
from doit.tools import config_changed

from ..config import DEFAULT_CONFIG_NAME, QuantflowConfig
from ..errors import ConfigError, QuantflowError
from ..tasks import STAGES
from ..tasks.sample import STAGE as SAMPLE
from ..tasks.stage import done_marker
from .build import Build, open_build

DEFAULT_TASKS = list(STAGES)
__all__ = [f"task_{name}" for name in STAGES]

# The one build this process runs, bound either explicitly (namespace(), which quantflow build calls) or, for a
# dodo.py, on first use from doit's command line; nothing about it is fixed at import.
_bound: dict[str, Build] = {}


def config_file() -> Path:
    """``doit config=FILE``, else $QUANTFLOW_CONFIG, else quantflow.toml in the current directory."""
    # get_var gives None outside a doit command line
    return Path(get_var("config", None) or os.environ.get("QUANTFLOW_CONFIG") or DEFAULT_CONFIG_NAME)


def namespace(config, cache=None) -> dict:
    """The task graph for one configuration (a file, or a configuration already loaded), as doit's
    ModuleTaskLoader takes it: the task_* creators and DOIT_CONFIG.  Binds this process's build to ``config``, with
    the artifact cache ``cache`` (a URL; False: none; None: $QUANTFLOW_CACHE, else the configuration's ``[cache]
    url``)."""
    _bound["build"] = open_build(config if isinstance(config, QuantflowConfig) else Path(config), cache)
    return {**{name: globals()[name] for name in __all__}, "DOIT_CONFIG": doit_config()}


def build() -> Build:
    """The bound build; a dodo.py's build is bound here, on first use, to config_file()."""
    if "build" not in _bound:
        try:
            _bound["build"] = open_build(config_file())
        except QuantflowError as err:  # a clean message instead of doit's traceback of the loader
            print(f"quantflow: {err}", file=sys.stderr)
            raise SystemExit(2) from None
    return _bound["build"]


def doit_config() -> dict:
    """doit's settings for the bound build: its state (sqlite, which commits atomically: a build killed while
    doit records its state cannot corrupt it) beside the build's own outputs, so that builds with different
    output folders never share it."""
    b = build()
    return {"default_tasks": [s.name for s in b.stages()], "verbosity": 2,
            "dep_file": str(b.cfg.out / ".doit.sqlite"), "backend": "sqlite3"}


def config_error_line(b: Build, err: ConfigError) -> str:
    """A ConfigError raised by a stage as one line naming the configuration file and (in ``err``) the field."""
    text = " ".join(str(err).split("\n"))
    where = str(b.config_file) if b.config_file is not None else str(b.cfg.root)
    return f"quantflow: {text}" if text.startswith(where) else f"quantflow: {where}: {text}"


def _action(stage):
    """The stage's run as a doit python-action: a QuantflowError is a clean task failure; a ConfigError (a setting
    or a file the configuration names is wrong) is one line naming the configuration file and the field, and doit
    exits 2 (a task error) as for a bad configuration; a keyed stage is pulled from the artifact cache instead of run
    where it holds it, its completion marker is its last write, and it is then pushed to the cache.  The error is
    kept on the build (``Build.failure``) for the Python API to raise."""
    @functools.wraps(stage.run)
    def action():
        b = build()
        pulled = False
        try:
            pulled = b.pull(stage)
            if not pulled:
                stage.run(b)
        except ConfigError as err:
            b.failure = err   # what the Python API (quantflow.api) raises once doit has stopped
            print(config_error_line(b, err), file=sys.stderr, flush=True)
            return TaskError(f"ConfigError: {err}", report=False)
        except QuantflowError as err:
            b.failure = err
            return TaskFailed(f"{type(err).__name__}: {err}")
        if stage.keyed:
            b.mark_done(stage.name)
            if not pulled:
                b.push(stage)
        return None
    return action


def _task(stage) -> dict:
    b = build()
    if not stage.used(b.cfg):
        return {"actions": None, "uptodate": [True], "doc": f"not used by this configuration: {stage.doc}"}
    task = {"doc": stage.doc, "actions": [_action(stage)], "task_dep": b.needs(stage), "verbosity": 2}
    extra = [(lambda: stage.uptodate(b))] if stage.uptodate else []
    if stage.keyed:
        folder = b.dir(stage.name)
        task.update(targets=[str(folder / o) for o in stage.outputs] + [str(done_marker(folder, stage.name))],
                    uptodate=[True] + extra, clean=True)
    else:
        task.update(targets=stage.targets(b) if stage.targets else [],
                    file_dep=stage.file_dep(b) if stage.file_dep else [],
                    uptodate=([config_changed(stage.key_inputs(b))] if stage.key_inputs else []) + extra)
    return task


def _creator(stage):
    def creator():
        return _task(stage)
    creator.__name__, creator.__doc__ = f"task_{stage.name}", stage.doc
    return create_after(executed=SAMPLE.name)(creator) if stage.keyed else creator


for _stage in STAGES.values():
    globals()[f"task_{_stage.name}"] = _creator(_stage)


def artifact_status(cfg) -> dict[str, tuple[bool, Path]]:
    """For each keyed stage: whether its artifacts for the current inputs are complete, and their folder.  Reads
    only (no lock, nothing written), so it may run beside a build; empty before the first ``sample``, whose
    manifest every key depends on."""
    from ..tasks.sample import manifest_path
    if not manifest_path(cfg).is_file():
        return {}
    b = Build(cfg)
    return {s.name: (b.done(s.name), b.dir(s.name, create=False)) for s in b.stages() if s.keyed}
