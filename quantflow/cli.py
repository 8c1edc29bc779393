"""The ``quantflow`` command: build, init, list, report.

    quantflow build [CONFIG ...] [-j N] [--always] [--task TASK ...]
    quantflow init (--onnx FILE | --mindir FILE | --entry MOD:FN --checkpoint FILE) [--calib DIR] [--eval DIR]
    quantflow list [CONFIG]
    quantflow report [CONFIG]

``build`` runs the installed task graph (quantflow.pipeline.tasks) through doit's own API, one config in
this process; several configs each in a process of their own, ``-j`` at a time.  Every build keeps its
doit state and its lock in its own ``build.output_dir``, so builds of different folders run side by
side and a second build of the same folder waits for the first.  A failure prints one line naming the
file or field at fault and exits with 2 (1 when a stage failed, with doit's report of it).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .config import DEFAULT_CONFIG_NAME, load_config
from .errors import QuantflowError

USAGE_ERROR = 2


# ----------------------------------------------------------------------------- build

def _build_here(config: Path, tasks: list[str], always: bool) -> int:
    from doit.cmd_base import ModuleTaskLoader
    from doit.doit_cmd import DoitMain

    os.environ["QUANTFLOW_CONFIG"] = str(config)  # read by the task graph (quantflow.pipeline.tasks.config_file)
    from .pipeline import tasks as graph

    namespace = {name: getattr(graph, name) for name in graph.__all__}
    namespace["DOIT_CONFIG"] = graph.doit_config()
    return DoitMain(ModuleTaskLoader(namespace)).run(["run", *(["--always-execute"] if always else []), *tasks])


def _build_apart(config: Path, tasks: list[str], always: bool) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "quantflow.cli", "build", str(config), *(["--always"] if always else [])]
    for t in tasks:
        cmd += ["--task", t]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def _check_output_dirs(configs: list[Path]) -> None:
    seen: dict[Path, Path] = {}
    for c in configs:
        out = load_config(c).out.resolve()
        if out in seen:
            raise QuantflowError(f"{seen[out]} and {c} both build into {out}: give them different build.output_dir "
                                 f"to build them together")
        seen[out] = c


def build(configs: list[Path], jobs: int, tasks: list[str], always: bool) -> int:
    if len(configs) == 1:
        return _build_here(configs[0], tasks, always)
    _check_output_dirs(configs)
    worst = 0
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for config, (code, text) in zip(configs, pool.map(lambda c: _build_apart(c, tasks, always), configs)):
            print(f"===== {config}: {'built' if code == 0 else f'FAILED (exit {code})'}")
            print(text, end="" if text.endswith("\n") else "\n")
            worst = max(worst, code)
    return worst


# ----------------------------------------------------------------------------- list / report

def stages() -> list[tuple[str, str]]:
    """(name, one-line description) of every stage, in the order a build runs them."""
    from .pipeline import tasks as graph
    return [(name, (getattr(graph, f"task_{name}").__doc__ or "").strip().splitlines()[0])
            for name in graph.DEFAULT_TASKS]


def list_stages(config: Path) -> int:
    latest = _latest(config, required=False)
    artifacts = latest.get("artifacts", {}) if latest else {}
    for name, doc in stages():
        where = f"  [{artifacts[name]}]" if name in artifacts else ""
        print(f"{name:<10} {doc}{where}")
    if not latest:
        print(f"(nothing built yet for {config})")
    return 0


def _latest(config: Path, required: bool = True) -> dict | None:
    path = load_config(config).out / "latest.json"
    if not path.is_file():
        if required:
            raise QuantflowError(f"no build to report: {path} not found (run `quantflow build {config}` first)")
        return None
    return json.loads(path.read_text())


def report(config: Path) -> int:
    latest = _latest(config)
    text = Path(latest["accuracy_report"])
    if not text.is_file():
        raise QuantflowError(f"{config}: the last build's report {text} is missing (rebuild with quantflow build)")
    print(text.read_text(), end="")
    g = latest["gate"]
    print(f"gate: {'PASS' if g['passed'] else 'FAIL'} (FP32 top-1 {g['fp32_top1']:.4f}, INT8 top-1 "
          f"{g['int8_top1']:.4f}, drop {g['drop']:.4f}, threshold {g['threshold']:g})")
    print(f"build report: {latest['report']}")
    return 0


# ----------------------------------------------------------------------------- main

def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="quantflow", description="INT8 quantization and .om build for Ascend NPUs")
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="run the build graph for one or more configs")
    b.add_argument("configs", nargs="*", type=Path, default=[Path(DEFAULT_CONFIG_NAME)])
    b.add_argument("-j", "--jobs", type=int, default=1, help="configs built at once (each in its own process)")
    b.add_argument("--always", action="store_true", help="rerun every stage, up to date or not")
    b.add_argument("--task", action="append", default=[], help="run only this stage (and what it needs)")
    i = sub.add_parser("init", help="write a commented quantflow.toml for your model")
    from .init_config import add_arguments
    add_arguments(i)
    for name, text in (("list", "the stages and the last build's artifacts"), ("report", "the last build's report")):
        p = sub.add_parser(name, help=text)
        p.add_argument("config", nargs="?", type=Path, default=Path(DEFAULT_CONFIG_NAME))
    return ap


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    try:
        if a.command == "build":
            if a.jobs < 1:
                raise QuantflowError(f"-j must be at least 1, got {a.jobs}")
            for c in a.configs:
                if not c.is_file():
                    raise QuantflowError(f"configuration file not found: {c}")
            return build(a.configs, a.jobs, a.task, a.always)
        if a.command == "init":
            from .init_config import write_config
            print(f"wrote {write_config(a)}; edit the lines marked EDIT, then run `quantflow build`")
            return 0
        return list_stages(a.config) if a.command == "list" else report(a.config)
    except QuantflowError as err:
        print(f"quantflow: {err}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
