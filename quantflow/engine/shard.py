"""Work split into shards and run where ``[engine]`` says: in this process, over local worker processes
(``engine.workers``) or as tasks on a Ray cluster (``engine.ray_address``).

``run(fn, shared, shards, engine)`` returns ``[fn(shared, s) for s in shards]``, in shard order, wherever
it ran.  ``fn`` is a module-level function (workers import it by name); ``shared`` is the large read-only
input (a graph, INT8 parameters, reference values), sent once per worker process or put once in Ray's
object store, not once per shard.  Each shard computes exactly what the single process computes for it
(same onnxruntime models on the same batches), so callers that cut shards on batch boundaries get the
same numbers bit for bit; tests/test_shard.py checks that for the gate and the per-layer analysis.
A Ray runtime started or joined here stays up for later calls (the gate's two passes, each fallback
check) and ends with the process.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from ..errors import ConfigError

_shared = None  # the worker process's copy of ``shared``


def _in_process(engine) -> bool:
    return engine is None or (engine.workers == 1 and not engine.ray_address)


def where(engine) -> str:
    """Where ``run`` sends work, for the build log."""
    if _in_process(engine):
        return "in this process"
    if engine.ray_address == "local":
        return f"over a local Ray runtime ({engine.workers} shards)"
    if engine.ray_address:
        return f"over Ray at {engine.ray_address} ({engine.workers} shards)"
    return f"over {engine.workers} local worker processes"


def split(n: int, parts: int, step: int = 1) -> list[range]:
    """``range(n)`` cut into at most ``parts`` contiguous pieces whose starts are multiples of ``step``."""
    per = -(-n // parts)
    size = max(step, -(-per // step) * step)
    return [range(s, min(n, s + size)) for s in range(0, n, size)]


def deal(items: list, parts: int) -> list[list]:
    """``items`` dealt round-robin into at most ``parts`` lists: balanced where the items' cost rises or
    falls along the list (the sweep's early ops run most of the graph, the late ones little of it)."""
    return [items[i::parts] for i in range(min(parts, len(items)))]


def run(fn, shared, shards: list, engine) -> list:
    """``[fn(shared, s) for s in shards]``: here, over ``engine.workers`` spawned processes (onnxruntime
    and MindSpore are not fork-safe), or as Ray tasks when ``engine.ray_address`` is set."""
    if _in_process(engine) or len(shards) <= 1:
        return [fn(shared, s) for s in shards]
    threads = max(1, (os.cpu_count() or 1) // engine.workers)  # this machine's cores, shared out
    if engine.ray_address:
        return _ray(fn, shared, shards, engine, threads)
    with ProcessPoolExecutor(max_workers=min(engine.workers, len(shards)),
                             mp_context=multiprocessing.get_context("spawn"),
                             initializer=_start_worker, initargs=(shared, threads)) as pool:
        return list(pool.map(_call, [fn] * len(shards), shards))


def _limit_threads(threads: int) -> None:
    from . import runner
    runner.THREADS = threads


def _start_worker(shared, threads: int) -> None:
    global _shared
    _shared = shared
    _limit_threads(threads)


def _call(fn, shard):
    return fn(_shared, shard)


def _ray_task(fn, shared, shard, threads: int):
    _limit_threads(threads)
    return fn(shared, shard)


def _ray(fn, shared, shards: list, engine, local_threads: int) -> list:
    try:
        import ray
    except ImportError:
        raise ConfigError(f"engine.ray_address = {engine.ray_address!r} needs Ray: pip install 'quantflow-ascend[ray]' (or the ray package)") from None
    local = engine.ray_address == "local"
    if not ray.is_initialized():
        if local:
            # address="local": a new runtime here, never a `ray start` cluster this machine may already run
            ray.init(address="local", num_cpus=engine.workers, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=engine.ray_address, log_to_driver=False)
    # a task holds one of Ray's CPUs: on a cluster, one core; on this machine, its share of the cores
    task = ray.remote(num_cpus=1)(_ray_task)
    ref = ray.put(shared)
    return ray.get([task.remote(fn, ref, s, local_threads if local else 1) for s in shards])
