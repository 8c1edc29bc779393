"""Work split into shards and run where ``[engine]`` says: in this process, over local worker processes
(``engine.workers``) or as tasks on a Ray cluster (``engine.ray_address``).

``run(fn, shared, shards, engine)`` returns ``[fn(shared, s) for s in shards]``, in shard order, wherever
it ran.  ``fn`` is a module-level function (workers import it by name); ``shared`` is the large read-only
input (a graph, INT8 parameters, images), sent once per worker process or put once in Ray's object
store, not once per shard.  Each shard computes exactly what the single process computes for it (same
onnxruntime model, same batches), so callers that cut shards on batch boundaries get the same numbers
bit for bit; tests/test_shard.py checks that for the gate and the per-layer analysis.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from ..errors import ConfigError

_shared = None  # the worker process's copy of ``shared``


def where(engine) -> str:
    """Where ``run`` sends work, for the build log."""
    if engine is None or (engine.workers == 1 and not engine.ray_address):
        return "in this process"
    if engine.ray_address:
        return f"over Ray ({engine.ray_address}, {engine.workers} shards)"
    return f"over {engine.workers} local worker processes"


def split(n: int, parts: int, step: int = 1) -> list[range]:
    """``range(n)`` cut into at most ``parts`` contiguous pieces whose starts are multiples of ``step``."""
    per = -(-n // parts)
    size = max(step, -(-per // step) * step)
    return [range(s, min(n, s + size)) for s in range(0, n, size)]


def run(fn, shared, shards: list, engine) -> list:
    if engine is None or len(shards) <= 1 or (engine.workers == 1 and not engine.ray_address):
        return [fn(shared, s) for s in shards]
    if engine.ray_address:
        return _ray(fn, shared, shards, engine)
    threads = max(1, (os.cpu_count() or 1) // engine.workers)
    with ProcessPoolExecutor(max_workers=min(engine.workers, len(shards)),
                             mp_context=multiprocessing.get_context("spawn"),  # onnxruntime is not fork-safe
                             initializer=_start_worker, initargs=(shared, threads)) as pool:
        return list(pool.map(_call, [fn] * len(shards), shards))


def _start_worker(shared, threads: int) -> None:
    global _shared
    from . import float_runner
    _shared, float_runner.THREADS = shared, threads


def _call(fn, shard):
    return fn(_shared, shard)


def _ray_task(fn, shared, shard):
    from . import float_runner
    float_runner.THREADS = 1  # a Ray task holds one CPU
    return fn(shared, shard)


def _ray(fn, shared, shards: list, engine) -> list:
    try:
        import ray
    except ImportError:
        raise ConfigError(f"engine.ray_address = {engine.ray_address!r} needs Ray: pip install 'quantflow[ray]'") from None
    if not ray.is_initialized():
        if engine.ray_address == "local":
            ray.init(num_cpus=engine.workers, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=engine.ray_address, log_to_driver=False)
    task = ray.remote(num_cpus=1)(_ray_task)
    ref = ray.put(shared)
    return ray.get([task.remote(fn, ref, s) for s in shards])
