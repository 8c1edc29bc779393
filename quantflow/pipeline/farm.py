"""Many builds across a Ray cluster: ``quantflow build A.toml B.toml ... --ray ADDRESS``.

``build_on_ray`` runs each configuration as a Ray task (one CPU) that runs ``python -m quantflow.cli build CONFIG``
in a subprocess on its worker (doit keeps process-global state: a process of its own keeps builds apart, as ``-j``
does) and prints each one's ``===== CONFIG: built | FAILED (exit N)`` block as it ends.

The address: ``local`` starts a Ray runtime on this machine for these builds (one task per core) and shuts it down
after; ``auto`` (the cluster this machine joined) or ``ray://head:10001`` joins a running cluster.  A runtime
already started in this process is used as it is and left up.

On ``local`` the workers share this file system: each build writes straight into its own ``build.output_dir``
and there is nothing to hand back.  On a cluster a worker on another machine writes into its own disk, so the
builds need the artifact cache (``--cache URL``, $QUANTFLOW_CACHE or each configuration's ``[cache] url``;
quantflow.pipeline.cache): the worker pushes every keyed stage it runs, and once its task ends the driver runs the
same build here with that cache, which pulls every keyed stage and runs only the cheap unkeyed ones (preflight,
sample, summary), so that ``output_dir`` on this machine holds the build's artifacts and its latest.json.  A remote
address without a cache is refused before anything runs; a build that failed on its worker is not pulled; where
the cache lacks a stage the worker built (it could not reach the cache) or the keys here differ from the worker's,
the driver's build runs those stages itself and its output says so.  The workers read each configuration, its
model and its images at the path the driver names (a shared mount or the same checkout), with the same quantflow
and tool versions (the artifact keys hash them; different versions would give keys the driver does not find).
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..config import load_config
from ..errors import ConfigError, QuantflowError
from ..tasks.summary import STAGE as SUMMARY
from ..tasks.summary import latest_path, read_latest
from .cache import CACHE_ENV, ArtifactCache, open_cache, resolve
from .store import FILE_SCHEME, is_folder_url

LOCAL = "local"


@dataclass
class Outcome:
    """One configuration's build as its Ray task reports it, then its pull into the driver's output_dir."""
    code: int                       # the build's exit code on the worker
    text: str                       # its output (stdout then stderr)
    host: str                       # the worker's host name
    keys: dict = field(default_factory=dict)   # each keyed stage's artifact key (from latest.json, when it passed)
    pull: tuple[int, str] | None = None        # the driver's pull: its exit code and output

    @property
    def worst(self) -> int:
        return max(self.code, self.pull[0] if self.pull else 0)


def check_output_dirs(configs: list[Path]) -> None:
    """Refuse two configurations that build into the same ``build.output_dir`` (as ``quantflow build -j`` does)."""
    seen: dict[Path, Path] = {}
    for c in configs:
        out = load_config(c).out.resolve()
        if out in seen:
            raise QuantflowError(f"{seen[out]} and {c} both build into {out}: give them different build.output_dir "
                                 f"to build them together")
        seen[out] = c


def cache_args(config: Path, cache: str | os.PathLike | bool | None) -> tuple[list[str], str | None]:
    """The cache a build of ``config`` uses (``quantflow.pipeline.cache.choose``: ``cache`` as the command line gives
    it, a URL, False for none or None; else $QUANTFLOW_CACHE; else the configuration's ``[cache] url``) as the
    ``build`` options that give a build in another process, with another environment, that same cache, and its URL
    (None: no cache).  A folder is made absolute: the other process may start in another folder."""
    url = resolve(cache, load_config(config))
    if url is None:
        return ["--no-cache"], None
    if is_folder_url(url) and not url.startswith(FILE_SCHEME):
        url = os.path.abspath(os.path.expanduser(url))
    return ["--cache", url], url


def _build_args(config: Path, cache: list[str], tasks: list[str], always: bool, baseline: Path | None) -> list[str]:
    """``quantflow build``'s arguments for one configuration."""
    args = ["build", str(config), *cache, *(["--always"] if always else [])]
    for t in tasks:
        args += ["--task", t]
    return args + (["--baseline", str(baseline)] if baseline is not None else [])


def _run(args: list[str]) -> tuple[int, str]:
    """``python -m quantflow.cli ARGS`` with the Python of the machine it runs on: its exit code and output."""
    proc = subprocess.run([sys.executable, "-m", "quantflow.cli", *args], capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def _keys(config: Path) -> dict:
    """The artifact keys ``<output_dir>/latest.json`` names for ``config`` ({} without one)."""
    try:
        return read_latest(latest_path(load_config(config))).get("keys", {})
    except (OSError, QuantflowError):
        return {}


def build_task(args: list[str], config: Path, keys: bool) -> Outcome:
    """The Ray task: one build (``quantflow build`` arguments) in a subprocess on this worker; with ``keys``, the
    keys it made when it passed (latest.json is written by its last stage, summary: only a whole build has them)."""
    code, text = _run(args)
    return Outcome(code, text, socket.gethostname(), _keys(config) if keys and code == 0 else {})


def _unpushed(cache: ArtifactCache, keys: dict) -> list[str]:
    """The stages of ``keys`` (stage -> key) whose entry ``cache`` does not hold whole."""
    out = []
    for stage, key in sorted(keys.items()):
        try:
            if not cache.holds(stage, key):
                out.append(stage)
        except Exception:  # noqa: BLE001  (a damaged entry, a cache that cannot be read: not there for the pull)
            out.append(stage)
    return out


def _pull(config: Path, outcome: Outcome, cache: tuple[list[str], ArtifactCache], tasks: list[str],
          baseline: Path | None) -> Outcome:
    """The driver's side of a build that ran elsewhere: the same build here, through the cache (no ``--always``: a
    pull, not a rebuild); a build that failed on its worker is not pulled.  Stages the worker could not hand back
    (no entry under its key: it could not reach the cache) or whose keys here differ from the worker's run here,
    and the output says so."""
    if outcome.code != 0:
        return outcome
    args, opened = cache
    unpushed = _unpushed(opened, outcome.keys)
    code, text = _run(_build_args(config, args, tasks, False, baseline))
    if unpushed:
        text += (f"quantflow: the cache {opened.url} holds no entry of {', '.join(unpushed)} under the keys "
                 f"{outcome.host} built (could it reach the cache?), so this build ran them again\n")
    here = _keys(config) if code == 0 and outcome.keys else {}
    differ = [s for s in sorted(outcome.keys) if here.get(s) != outcome.keys[s] and s not in unpushed]
    if code == 0 and differ:
        text += (f"quantflow: the artifact keys of {', '.join(differ)} here differ from the worker's: this machine "
                 f"and {outcome.host} do not see the same inputs or tool versions, so this build ran them again\n")
    outcome.pull = (code, text)
    return outcome


def _block(config: Path, outcome: Outcome, pulled_into: Path | None) -> str:
    """The ``===== CONFIG: built | FAILED (exit N)`` block: the build's output, and with a pull where it ran and
    the pull's output."""
    code = outcome.worst
    lines = [f"===== {config}: {'built' if code == 0 else f'FAILED (exit {code})'}"]
    if pulled_into is not None:
        lines.append(f"----- built on {outcome.host}")
    lines.append(outcome.text.rstrip("\n"))
    if outcome.pull is not None:
        lines += [f"----- pulled into {pulled_into} from the cache", outcome.pull[1].rstrip("\n")]
    elif pulled_into is not None:
        lines.append(f"----- not pulled into {pulled_into}: the build failed on {outcome.host}")
    return "\n".join(lines) + "\n"


def _ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("quantflow build --ray needs Ray: pip install 'quantflow-ascend[ray]' (the ray extra)") \
            from None
    return ray


def _start(ray, address: str) -> bool:
    """Start (``local``) or join a Ray runtime unless this process has one; whether it is ours to shut down."""
    if ray.is_initialized():
        return False
    try:
        if address == LOCAL:
            # address="local": a runtime of its own even where `ray start` left a cluster on this machine (no
            # address would join that one); only command lines and output text cross the object store: a small one
            ray.init(address=LOCAL, num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
                     object_store_memory=100 * 1024 ** 2)
        else:
            ray.init(address=address, log_to_driver=False)
    except Exception as err:  # noqa: BLE001  (Ray's own ConnectionError, ValueError, RuntimeError, ...)
        what = "cannot start a local Ray runtime" if address == LOCAL else "cannot join the Ray cluster"
        raise QuantflowError(f"--ray {address!r}: {what}: {type(err).__name__}: {err}") from None
    return True


def build_on_ray(configs: list[Path], address: str, cache: str | os.PathLike | bool | None, tasks: list[str],
                 always: bool, baseline: Path | None = None, *, pull: bool | None = None,
                 worker_path: Callable[[Path], Path] | None = None) -> int:
    """Build every configuration as a task of the Ray runtime at ``address``; the worst exit code.  Prints each
    one's ``===== CONFIG: built | FAILED (exit N)`` block, with its output, as it ends.

    ``cache``: a URL, False (none) or None ($QUANTFLOW_CACHE, else each configuration's ``[cache] url``).
    ``pull``: pull each build into this machine's output_dir through the cache once its task ends (default: on any
    address but ``local``).  ``worker_path``: where the workers find a configuration (default: where the driver
    does; made absolute).  Raises QuantflowError before anything runs where two configurations share an
    output_dir, a pull has no cache, or Ray is not installed."""
    configs = [Path(c) for c in configs]
    check_output_dirs(configs)
    pull = address != LOCAL if pull is None else pull
    caches = {}
    for c in configs:
        # a URL that names no cache (an unknown scheme, s3fs missing) stops here, before anything runs
        opened = open_cache(cache, load_config(c), c)
        caches[c] = cache_args(c, cache)[0], opened
        if pull and opened is None:
            raise QuantflowError(
                f"{c}: building on the Ray cluster at {address!r} needs an artifact cache, through which workers "
                f"on other machines hand back their artifacts: give --cache URL (a shared folder or "
                f"s3://bucket/prefix), set ${CACHE_ENV} or [cache] url{', not --no-cache' if cache is False else ''}")
    baseline = Path(baseline).resolve() if baseline is not None else None
    where = worker_path or (lambda c: c.resolve())
    ray = _ray()
    ours = _start(ray, address)
    task = ray.remote(num_cpus=1)(build_task)
    whole = not tasks or SUMMARY.name in tasks   # the build writes latest.json: its keys are this build's
    refs = {c: task.remote(_build_args(where(c), caches[c][0], tasks, always, baseline), where(c), whole)
            for c in configs}
    pulls = threading.Semaphore(os.cpu_count() or 1)   # pulls run here: a few at a time

    def one(c: Path) -> Outcome:
        try:
            outcome = ray.get(refs[c])
        except ray.exceptions.RayError as err:   # the worker died, the task was cancelled, the cluster went away
            return Outcome(1, f"quantflow: the Ray task building {c} failed: {err}\n", "an unknown worker")
        if not pull:
            return outcome
        with pulls:
            return _pull(c, outcome, caches[c], tasks, baseline)

    worst = 0
    pool = ThreadPoolExecutor(max_workers=max(1, len(configs)))
    try:
        running = {pool.submit(one, c): c for c in configs}
        for done in as_completed(running):
            c = running[done]
            outcome = done.result()
            print(_block(c, outcome, load_config(c).out if pull else None), end="", flush=True)
            worst = max(worst, outcome.worst)
    except BaseException:   # Ctrl-C or an error here: the builds still running are stopped, not left behind
        for ref in refs.values():
            with contextlib.suppress(Exception):   # a cluster already gone: nothing left to stop
                ray.cancel(ref)   # a KeyboardInterrupt in the task: subprocess.run kills the build
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if ours:
            ray.shutdown()
    return worst
