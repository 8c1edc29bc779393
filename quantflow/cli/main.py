"""The ``quantflow`` command: build, init, list, report, and on an Ascend host verify and dump.

    quantflow build [CONFIG ...] [STAGE ...] [-j N] [--always] [--baseline PATH] [--cache URL | --no-cache]
                    [--ray ADDRESS]
    quantflow compare A B
    quantflow cache (ls | verify | prune [--older-than DAYS] [--max-size SIZE]) [CONFIG] [--cache URL]
    quantflow init (--onnx FILE | --mindir FILE | --entry MOD:FN --checkpoint FILE) [--calib DIR] [--eval DIR] [-o FILE]
    quantflow list [CONFIG]
    quantflow report [CONFIG]
    quantflow verify [CONFIG] [--om FILE] [--device N] [--images N] [--min-cosine C]
    quantflow dump [CONFIG] [-o DIR] [--image FILE ...]

``compare`` prints two builds' accuracy reports (each an accuracy_report.json, a gate stage folder or a build
output folder) side by side, figure by figure.  ``build --baseline PATH`` is ``evaluation.baseline = PATH`` for
this build (docs/release-gate.md).

``build`` is a thin layer over the Python API (``quantflow.api.build``), which runs the installed task graph
(quantflow.pipeline.doit_graph) through doit's own API: one config in this process; several configs each in a
process of its own, ``-j`` at a time, or each as a Ray task (``--ray``).  Every build keeps its doit state and
its lock in its own ``build.output_dir``, so builds of different folders run side by side; two configs of one
command naming the same folder are refused before anything runs, and a build of a folder another command is
building waits for it (quantflow.pipeline.lock).

Exit codes: 0 done; 1 a stage failed (doit's report of it on the output, the gate included); 2 a bad command
line, config or file, with one message naming the file or field at fault and no traceback.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..config import BASELINE_ENV, DEFAULT_CONFIG_NAME, load_config
from ..errors import QuantflowError

USAGE_ERROR = 2


# ----------------------------------------------------------------------------- build

def _split_targets(targets: list[str], tasks: list[str]) -> tuple[list[Path], list[str]]:
    """``build``'s positional arguments as (config files, stages): a stage name is a stage unless a file of that
    name exists; no config given means quantflow.toml."""
    from ..pipeline.doit_graph import DEFAULT_TASKS

    configs, stages = [], list(tasks)
    for t in targets:
        if t in DEFAULT_TASKS and not Path(t).is_file():
            stages.append(t)
        elif Path(t).is_file() or t.endswith(".toml"):
            configs.append(Path(t))
        else:
            raise QuantflowError(f"{t!r} is neither a configuration file nor a stage ({', '.join(DEFAULT_TASKS)})")
    unknown = [s for s in stages if s not in DEFAULT_TASKS]
    if unknown:
        raise QuantflowError(f"unknown stage {unknown[0]!r}; the stages are {', '.join(DEFAULT_TASKS)}")
    return configs or [Path(DEFAULT_CONFIG_NAME)], stages


def _build_here(config: Path, tasks: list[str], always: bool, cache) -> int:
    """One configuration in this process, through the Python API (``quantflow.api.build``): 0 when the gate passed
    (or was not among the stages run), 1 when it failed; an error is raised."""
    from ..api import build as api_build

    result = api_build(config, cache=cache, always=always, stages=tasks)
    return 0 if result.verdict is None or result.passed else 1


def _cache_args(cache) -> list[str]:
    """``build``'s cache options again, for a build run in another process."""
    return ["--no-cache"] if cache is False else ["--cache", str(cache)] if cache else []


def _build_apart(config: Path, tasks: list[str], always: bool, cache) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "quantflow.cli", "build", str(config), *(["--always"] if always else []),
           *_cache_args(cache)]
    for t in tasks:
        cmd += ["--task", t]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def build(configs: list[Path], jobs: int, tasks: list[str], always: bool, cache=None, ray: str | None = None,
          baseline: Path | None = None) -> int:
    """Build every config; the worst exit code.  ``cache``: a URL, False (none) or None ($QUANTFLOW_CACHE, else
    each config's ``[cache] url``).  Several configs: each in a subprocess, ``jobs`` at a time, each one's output
    printed whole under a ``===== CONFIG: built | FAILED`` line when it ends; with ``ray`` (an address), each as a
    task of that Ray cluster (quantflow.pipeline.farm)."""
    if jobs < 1:
        raise QuantflowError(f"-j must be at least 1, got {jobs}")
    from ..pipeline.farm import build_on_ray, check_output_dirs

    if ray is not None:
        return build_on_ray(configs, ray, cache, tasks, always, baseline)
    if len(configs) == 1:
        return _build_here(configs[0], tasks, always, cache)
    check_output_dirs(configs)
    worst = 0
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for config, (code, text) in zip(configs, pool.map(lambda c: _build_apart(c, tasks, always, cache), configs)):
            print(f"===== {config}: {'built' if code == 0 else f'FAILED (exit {code})'}")
            print(text, end="" if text.endswith("\n") else "\n", flush=True)
            worst = max(worst, code)
    return worst


# ----------------------------------------------------------------------------- list / report

def list_stages(config: Path) -> int:
    """Each stage with its state and where its current output is; reads only, so it may run during a build."""
    from ..pipeline.build import Build
    from ..pipeline.doit_graph import artifact_status
    from ..tasks import STAGES

    c = load_config(config)
    keyed = artifact_status(c)
    b = Build(c)
    width = max(map(len, STAGES))
    for name, stage in STAGES.items():
        if not stage.used(c):
            state, where = "not used", None
        elif name in keyed:
            done, where = keyed[name]
            state = "up to date" if done else "to run"
        elif stage.keyed:
            state, where = "to run", None
        else:
            state, where = stage.status(b)
        print(f"{name:<{width}} {state:<10}  {stage.doc}" + (f"  [{where}]" if where else ""))
    if not keyed:
        print(f"(nothing sampled yet for {config}: the artifact folders are known once `sample` has run)")
    return 0


def report(config: Path) -> int:
    """Print the last build's accuracy report and the gate's verdict (from ``<output_dir>/latest.json``)."""
    from ..tasks.summary import latest_path, read_latest

    path = latest_path(load_config(config))
    if not path.is_file():
        raise QuantflowError(f"no build to report: {path} not found (run `quantflow build {config}` first)")
    latest = read_latest(path)
    try:
        text, g = Path(latest["accuracy_report"]), latest["gate"]
        verdict = f"gate: {'PASS' if g['passed'] else 'FAIL'} ({g['verdict']})"
    except (KeyError, TypeError) as err:
        raise QuantflowError(f"{path} lacks {err}; rebuild with `quantflow build`") from None
    if not text.is_file():
        raise QuantflowError(f"the last build's report {text} (named by {path}) is missing; rebuild with "
                             f"`quantflow build`")
    print(text.read_text(), end="")
    print(verdict)
    print(f"build report: {latest.get('report')}")
    return 0


def _figure_text(f: dict | None) -> str:
    from ..evaluation.intervals import number
    if f is None:
        return "-"
    iv = "" if f.get("low") is None else f" [{number(f['low'])}, {number(f['high'])}]"
    return f"{number(f['value'])}{iv} {f['verdict']}"


def _row_text(o: dict | None) -> str:
    if o is None:
        return "-"
    iv = o.get("cosine_interval")
    return f"{o['cosine']:.5f}" + (f" [{iv[0]:.5f}, {iv[1]:.5f}]" if iv else "") + f" / {o['sqnr_db']:.1f} dB"


def compare(a: Path, b: Path) -> int:
    """Two accuracy reports side by side: the verdicts, each gated figure (value, interval, verdict), each output's
    and part's cosine / SQNR; whether the held-out images are the same."""
    from ..evaluation.baseline import load

    (ra, _, pa), (rb, _, pb) = load(a, "A"), load(b, "B")
    same = (ra.get("held_out", {}).get("sha256") is not None
            and sorted(ra["held_out"]["sha256"]) == sorted(rb.get("held_out", {}).get("sha256") or []))
    print(f"A: {pa}\nB: {pb}")
    print(f"held-out images: {'the same' if same else 'NOT the same (figures are not comparable image for image)'}")
    rows = [("verdict", f"{'PASS' if ra['passed'] else 'FAIL'} ({ra.get('verdict', '-')})",
             f"{'PASS' if rb['passed'] else 'FAIL'} ({rb.get('verdict', '-')})", ""),
            ("metric", ra.get("metric", "top1"), rb.get("metric", "top1"), ""),
            ("range method", ra.get("calibration_method", "?"), rb.get("calibration_method", "?"), ""),
            ("INT8 ops", str(ra.get("quantized_ops", "?")), str(rb.get("quantized_ops", "?")), "")]
    fa, fb = ({f["id"]: f for f in r.get("figures", [])} for r in (ra, rb))
    for fid in dict.fromkeys([*fa, *fb]):
        x, y = fa.get(fid), fb.get(fid)
        diff = (f"{y['value'] - x['value']:+.6g}" if x and y and x["value"] is not None and y["value"] is not None
                else "")
        rows.append((fid, _figure_text(x), _figure_text(y), diff))
    oa, ob = ({(o["output"], o["part"]): o for o in r.get("outputs", [])} for r in (ra, rb))
    for key in dict.fromkeys([*oa, *ob]):
        x, y = oa.get(key), ob.get(key)
        diff = f"{y['cosine'] - x['cosine']:+.6f}" if x and y else ""
        rows.append((f"{key[1] or key[0]} cosine / SQNR", _row_text(x), _row_text(y), diff))
    w = [max(len(r[i]) for r in rows + [("figure", "A", "B", "B - A")]) for i in range(4)]
    for r in [("figure", "A", "B", "B - A")] + rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip())
    return 0


# ----------------------------------------------------------------------------- main

def _parser() -> argparse.ArgumentParser:
    from .init import add_arguments

    ap = argparse.ArgumentParser(prog="quantflow", description="INT8 quantization and .om build for Ascend NPUs")
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="run the build graph for one or more configs")
    b.add_argument("targets", nargs="*", metavar="CONFIG|STAGE",
                   help=f"configuration files (default {DEFAULT_CONFIG_NAME}) and the stages to run with what they "
                        f"need (default all)")
    b.add_argument("-j", "--jobs", type=int, default=1, help="configs built at once (each in its own process)")
    b.add_argument("--always", action="store_true", help="rerun every stage, up to date or not")
    b.add_argument("--task", action="append", default=[], help="a stage to run (for a stage named like a file)")
    b.add_argument("--baseline", type=Path, help="a previous build's accuracy_report.json or output folder: the gate "
                                                 "also fails where a figure is worse than it (evaluation.baseline)")
    b.add_argument("--cache", metavar="URL", help="the shared artifact cache: a folder or an fsspec URL such as "
                                                  "s3://bucket/prefix (default $QUANTFLOW_CACHE, else [cache] url)")
    b.add_argument("--no-cache", action="store_true", help="use no artifact cache for this build")
    b.add_argument("--ray", metavar="ADDRESS", help="build each config as a task of a Ray cluster: 'local' (a runtime "
                                                    "started here), 'auto' or 'ray://head:10001' (needs a cache)")
    c = sub.add_parser("compare", help="two builds' accuracy reports side by side, figure by figure")
    c.add_argument("a", type=Path, metavar="A", help="an accuracy_report.json, a gate stage folder or an output folder")
    c.add_argument("b", type=Path, metavar="B")
    i = sub.add_parser("init", help="write a commented quantflow.toml for your model")
    add_arguments(i)
    i.add_argument("--data", dest="calib", type=Path, default=argparse.SUPPRESS, help="the same as --calib")
    from .cache import add_arguments as cache_arguments
    cache_arguments(sub.add_parser("cache", help="the shared artifact cache: ls, verify, prune"))
    for name, text in (("list", "the stages, their state and artifact folders"), ("report", "the last build's report")):
        p = sub.add_parser(name, help=text)
        p.add_argument("config", nargs="?", type=Path, default=Path(DEFAULT_CONFIG_NAME))
    from .verify import DEFAULT_MIN_COSINE
    v = sub.add_parser("verify", help="on an Ascend host: run the last build's .om on the held-out images (ais_bench) "
                                      "and compare every output with the emulation the gate measured")
    v.add_argument("config", nargs="?", type=Path, default=Path(DEFAULT_CONFIG_NAME))
    v.add_argument("--om", type=Path, help="the .om to run (default: the one the last build made)")
    v.add_argument("--device", type=int, default=0, help="the NPU's device id (default 0)")
    v.add_argument("--images", type=int, help="compare on the first N held-out images (default all)")
    v.add_argument("--min-cosine", type=float, default=DEFAULT_MIN_COSINE,
                   help=f"exit 1 when an output's cosine to the emulation is below this (default {DEFAULT_MIN_COSINE})")
    d = sub.add_parser("dump", help="write the emulation's per-layer tensors as golden .npy files for CANN's "
                                    "accuracy comparison, with the .om's input for the same images")
    d.add_argument("config", nargs="?", type=Path, default=Path(DEFAULT_CONFIG_NAME))
    d.add_argument("-o", "--output", type=Path, help="the folder to write (default <build.output_dir>/dump)")
    d.add_argument("--image", type=Path, action="append", default=[],
                   help="an image to dump (repeatable, at most the model's batch; default the first held-out images)")
    return ap


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    try:
        if a.command == "build":
            configs, tasks = _split_targets(a.targets, a.task)
            if a.baseline is not None:
                from ..evaluation.baseline import locate
                locate(a.baseline, "--baseline")
                os.environ[BASELINE_ENV] = str(a.baseline.resolve())
            if a.cache and a.no_cache:
                raise QuantflowError("--cache and --no-cache contradict each other; give one")
            cache = False if a.no_cache else a.cache
            try:
                return build(configs, a.jobs, tasks, a.always, cache, a.ray, a.baseline)
            finally:
                os.environ.pop(BASELINE_ENV, None)
        if a.command == "init":
            from .init import write_config
            print(f"wrote {write_config(a)}; edit the lines marked EDIT, then run `quantflow build`")
            return 0
        if a.command == "verify":
            from .verify import verify
            return verify(a.config, a.om, a.device, a.images, a.min_cosine)
        if a.command == "dump":
            from .dump import dump
            return dump(a.config, a.output, a.image)
        if a.command == "compare":
            return compare(a.a, a.b)
        if a.command == "cache":
            from .cache import run as cache_command
            return cache_command(a)
        return list_stages(a.config) if a.command == "list" else report(a.config)
    except (QuantflowError, OSError) as err:
        if not getattr(err, "printed", False):   # a stage's error the build's own output has already said
            print(f"quantflow: {err}", file=sys.stderr)
        return getattr(err, "exit_code", USAGE_ERROR)
