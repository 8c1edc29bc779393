"""Benchmark: what the shared artifact cache saves a runner that did not build the model itself.

    python -m benchmarks.cache                                  # examples/mobilenet_v2, 3 rounds
    python -m benchmarks.cache --repeat 5 --cache-url s3://bucket/prefix --json out.json

Each round makes three fresh copies of the project (``examples/mobilenet_v2/quantflow.toml`` with the shipped
checkpoint, its training record and the image folders, laid out as in the repository; untimed), each a new
"clone" in a folder of its own, and runs ``python -m quantflow.cli build examples/mobilenet_v2/quantflow.toml``
(what ``quantflow build`` runs) in each, with quantflow imported from a snapshot of this checkout taken at the start
(``snapshot``):

- **cold, no cache** (``--no-cache``): every stage runs;
- **cold, pushing** (``--cache`` an empty cache: a new folder, or a new prefix under ``--cache-url``): every stage
  runs and each keyed stage's folder is pushed; its time over the first is the push overhead;
- **warm** (``--cache`` the cache the second filled, in the third copy): every keyed stage is pulled (checked file by
  file), only the unkeyed ones run (preflight, sample, summary).

The push overhead is also timed alone, since on a busy machine the difference of two whole builds hides it: the
cold build's keyed folders pushed to another empty cache and pulled back, in this process.

Each run is measured from outside as a whole process (``benchmarks.measure``: wall and CPU seconds).  The warm
build must pull every keyed stage under the cold build's keys and reach the same verdict; a round where it does not
is run again (the keys hash quantflow's own source: an edit of the checkout during the round changes them), and
reported as such if it still does not.  The table gives the median (min-max) over the rounds; the ratios are
computed round by round.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.measure import measure

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = Path("examples/mobilenet_v2/quantflow.toml")
# what the example reads, relative to the repository (its paths are "../../..." from its folder)
PROJECT_FILES = [EXAMPLE, Path("quantflow/demo/checkpoints/digits_mbv2.ckpt"),
                 Path("quantflow/demo/checkpoints/digits_mbv2.train.json"), Path("calib_data"), Path("eval_data")]
RETRIES = 3   # a round whose builds disagree on the keys (the source edited meanwhile) is run again, this often
RUNS = (("cold", "cold, no cache"), ("push", "cold, pushing to an empty cache"), ("warm", "warm, from the cache"))


def copy_project(dest: Path) -> Path:
    for rel in PROJECT_FILES:
        src, dst = ROOT / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
    return dest


def snapshot(dest: Path) -> Path:
    """This checkout's quantflow as a wheel lays it out (tasks/ and aipp_templates/ inside the package), for the
    builds to import: an edit of the checkout while the benchmark runs cannot change their keys."""
    skip = shutil.ignore_patterns("__pycache__", "checkpoints")
    shutil.copytree(ROOT / "quantflow", dest / "quantflow", ignore=skip)
    for name in ("tasks", "aipp_templates"):
        shutil.copytree(ROOT / name, dest / "quantflow" / name, ignore=skip)
    return dest


def _env(source: Path) -> dict:
    """quantflow from ``source``, no CANN toolkit (as the tests' builds), no cache from outside."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND") and k != "QUANTFLOW_CACHE"}
    env["PYTHONPATH"] = os.pathsep.join([str(source), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def build(project: Path, cache_args: list[str], source: Path):
    run = measure([sys.executable, "-m", "quantflow.cli", "build", str(EXAMPLE), *cache_args], cwd=project,
                  env=_env(source))
    if run.returncode != 0:
        raise SystemExit(f"build in {project} failed (exit {run.returncode}):\n{run.output[-3000:]}")
    latest = json.loads((project / EXAMPLE.parent / "build" / "latest.json").read_text())
    return run, latest


def _fresh(cache_url: str | None, workdir: Path, name: str) -> str:
    return f"{cache_url.rstrip('/')}/{name}-{uuid.uuid4().hex[:8]}" if cache_url else str(workdir / name)


def cache_work(latest: dict, url: str, into: Path) -> dict:
    """The cache's own work on one build's keyed folders, timed in this process: every folder pushed to an empty
    cache, then pulled (every file checked) into ``into``; and the bytes stored."""
    from quantflow.pipeline.cache import ArtifactCache

    cache, start = ArtifactCache(url), time.perf_counter()
    for stage, folder in latest["artifacts"].items():
        cache.push(stage, latest["keys"][stage], Path(folder))
    pushed = time.perf_counter()
    pulled = sum(ArtifactCache(url).pull(stage, key, into / stage / key) for stage, key in latest["keys"].items())
    done = time.perf_counter()
    if pulled != len(latest["keys"]):
        raise SystemExit(f"pulled {pulled} of the {len(latest['keys'])} entries just pushed to {url}")
    return {"push_s": pushed - start, "pull_s": done - pushed, "bytes": sum(e.size for e in cache.entries())}


def one_round(workdir: Path, cache_url: str | None, source: Path) -> dict:
    """The three builds of one round: their wall and CPU seconds, whether the warm one pulled everything, and the
    cache's own push and pull time on the cold build's folders."""
    url = _fresh(cache_url, workdir, "cache")
    out, keys, verdicts = {}, {}, {}
    for name, args in (("cold", ["--no-cache"]), ("push", ["--cache", url]), ("warm", ["--cache", url])):
        run, latest = build(copy_project(workdir / name), args, source)
        out[name] = {"wall_s": run.wall_s, "cpu_s": run.user_s + run.sys_s}
        keys[name], verdicts[name] = latest["keys"], latest["gate"]["verdict"]
        if name == "cold":
            out["direct"] = cache_work(latest, _fresh(cache_url, workdir, "direct"), workdir / "direct-pull")
        if name == "warm":
            pulled = sum(f"cache: {s} {k} pulled from" in run.output for s, k in latest["keys"].items())
            out["pulled"] = f"{pulled}/{len(latest['keys'])}"
    out["same_keys"] = keys["cold"] == keys["push"] == keys["warm"]
    out["same_verdict"] = verdicts["cold"] == verdicts["warm"]
    return out


def _stat(values: list[float], fmt: str = ".1f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def format_table(rounds: list[dict]) -> str:
    """The markdown table of ``rounds`` (``one_round``'s results): each run's wall and CPU seconds, and its ratio to
    the cold build without cache, as median (min-max) over the rounds."""
    lines = ["| build | wall s | CPU s | wall / cold |", "|---|---|---|---|"]
    for name, label in RUNS:
        ratio = [r[name]["wall_s"] / r["cold"]["wall_s"] for r in rounds]
        ratio_text = "1" if name == "cold" else f"{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})"
        lines.append(f"| {label} | {_stat([r[name]['wall_s'] for r in rounds])} | "
                     f"{_stat([r[name]['cpu_s'] for r in rounds])} | {ratio_text} |")
    overhead = [r["push"]["wall_s"] - r["cold"]["wall_s"] for r in rounds]
    lines.append(f"| cache overhead: pushing - cold | {_stat(overhead)} | | |")
    if all("direct" in r for r in rounds):
        mb = statistics.median(r["direct"]["bytes"] for r in rounds) / 2 ** 20
        for what in ("push", "pull"):
            lines.append(f"| cache overhead: {what} of the keyed folders ({mb:.1f} MB), timed alone | "
                         f"{_stat([r['direct'][f'{what}_s'] for r in rounds], '.2f')} | | |")
    checks = [f"warm pulled {r['pulled']} keyed stages, same keys {'yes' if r['same_keys'] else 'NO'}, same verdict "
              f"{'yes' if r['same_verdict'] else 'NO'}" for r in rounds]
    return "\n".join(lines) + f"\n\n{len(rounds)} round(s): " + "; ".join(dict.fromkeys(checks)) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cache", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    ap.add_argument("--cache-url", help="an fsspec URL to push to and pull from, a fresh prefix under it each round "
                                        "(default: a new folder each round)")
    ap.add_argument("--json", type=Path, help="also write every round's figures here")
    a = ap.parse_args(argv)
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    rounds = []
    source = snapshot(Path(tempfile.mkdtemp(prefix="quantflow-cache-bench-source-")))
    for i in range(a.repeat):
        for _ in range(RETRIES):
            with tempfile.TemporaryDirectory(prefix="quantflow-cache-bench-") as tmp:
                r = one_round(Path(tmp), a.cache_url, source)
            if r["same_keys"]:
                break
            print("the keys changed within the round (quantflow's source was edited under it): round run again",
                  file=sys.stderr, flush=True)
        rounds.append(r)
        print(f"round {i + 1}/{a.repeat}: " + ", ".join(f"{n} {rounds[-1][n]['wall_s']:.1f} s" for n, _ in RUNS),
              file=sys.stderr, flush=True)
    shutil.rmtree(source, ignore_errors=True)
    print(format_table(rounds), end="")
    if a.json:
        a.json.write_text(json.dumps(rounds, indent=2) + "\n")
    return 0 if all(r["same_keys"] and r["same_verdict"] for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
