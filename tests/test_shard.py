"""Sharded evaluation (engine.workers, engine.ray_address) gives the single process's numbers bit for bit."""
from __future__ import annotations

import builtins
import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
from quantflow.tasks.inputs import evaluation_set

from quantflow.backends.aipp import parse
from quantflow.config import EngineSection
from quantflow.engine import shard
from quantflow.errors import ConfigError
from quantflow.evaluation.runs import fp32_logits, int8_logits, output_stats
from quantflow.frontends.mindir import read_mindir
from quantflow.quantization.calibrater import calibrate
from quantflow.quantization.deploy import quantized_graph
from quantflow.quantization.passes import fold_for_quantization
from quantflow.quantization.qparams import QuantParams
from quantflow.quantization.sensitivity import analyse

TWO_PROCESSES = EngineSection(workers=2)
LOCAL_RAY = EngineSection(workers=2, ray_address="local")


@pytest.fixture(scope="module")
def ray():
    """Ray, shut down after this module's tests (the first of them starts its local runtime through
    ``engine.ray_address = "local"``).  Ray is in the test extra: a missing one fails, it is not skipped."""
    import ray
    with pytest.MonkeyPatch.context() as mp:  # Ray's workers import _echo by module name, as spawned processes do
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])))
        yield ray
        ray.shutdown()


@pytest.fixture(params=["processes", "ray"])
def engine(request, ray):
    return {"processes": TWO_PROCESSES, "ray": LOCAL_RAY}[request.param]


def test_split_cuts_contiguous_runs_on_batch_boundaries():
    assert shard.split(1000, 2, 64) == [range(0, 512), range(512, 1000)]
    assert shard.split(10, 3) == [range(0, 4), range(4, 8), range(8, 10)]
    assert shard.split(5, 4, 8) == [range(0, 5)]
    assert [i for r in shard.split(359, 3, 32) for i in r] == list(range(359))


def test_deal_spreads_items_round_robin():
    assert shard.deal(list("abcdefg"), 3) == [["a", "d", "g"], ["b", "e"], ["c", "f"]]
    assert shard.deal([1, 2], 4) == [[1], [2]]
    assert shard.deal([1, 2, 3], 1) == [[1, 2, 3]]


def _echo(shared, piece):
    from quantflow.engine import runner
    return shared, piece, runner.THREADS


def test_shards_come_back_in_order_with_the_shared_input_and_a_share_of_the_threads(engine, ray):
    got = shard.run(_echo, {"graph": "shared"}, [3, 1, 4, 1, 5], engine)
    share = max(1, (os.cpu_count() or 1) // 2)
    assert got == [({"graph": "shared"}, piece, share) for piece in [3, 1, 4, 1, 5]]
    if engine.ray_address:  # "local": a runtime of engine.workers CPUs, started here
        assert ray.is_initialized() and ray.cluster_resources()["CPU"] == 2
    assert shard.run(_echo, "here", [7], EngineSection())[0] == ("here", 7, None)


@pytest.fixture(scope="module")
def demo(built_demo, demo_cfg):
    dirs = {k: Path(v) for k, v in json.loads((built_demo[0] / "build" / "latest.json").read_text())["artifacts"].items()}
    graph = read_mindir(dirs["graph"] / "model.mindir")
    cfg = demo_cfg.model_copy(update={"evaluation": demo_cfg.evaluation.model_copy(update={"batch_size": 32})})
    qp = QuantParams.load(dirs["fallback"])
    aipp = parse((dirs["aipp"] / "aipp.cfg").read_text())
    ev = evaluation_set(cfg)
    deploy = quantized_graph(fold_for_quantization(graph), qp)
    return ev, graph, deploy, aipp, fp32_logits(ev, graph), ev.labels, int8_logits(ev, deploy, aipp)


def _with(ev, engine):
    return dataclasses.replace(ev, engine=engine)


def test_sharded_gate_logits_equal_the_single_process_ones(demo, engine):
    ev, graph, deploy, aipp, fp, labels, q = demo
    fp_s = fp32_logits(_with(ev, engine), graph)
    q_s = int8_logits(_with(ev, engine), deploy, aipp)
    assert len(fp) == len(labels) == 359 and len(shard.split(359, 2, 32)) == 2
    assert np.array_equal(fp_s, fp) and np.array_equal(q_s, q)


def test_sharded_output_statistics_equal_the_single_process_ones(demo, engine):
    """evaluation.metric = "outputs": the per-image sums over every output, however the images are cut."""
    ev, graph, deploy, aipp, *_ = demo
    one = output_stats(ev, graph, deploy, aipp)
    assert one.shape == (359, 1, 5) and np.all(one[:, 0, 1] > 0)
    assert np.array_equal(output_stats(_with(ev, engine), graph, deploy, aipp), one)


@pytest.fixture(scope="module")
def residual(tmp_path_factory):
    from support import (
        nets,  # MindSpore: not at the top, so that workers unpickling _echo by reference do not import it
    )

    path = nets.export(nets.ResidualNet(), tmp_path_factory.mktemp("shard") / "res.mindir")
    folded = fold_for_quantization(read_mindir(path))
    calib = np.random.default_rng(1).normal(size=(32, 3, 16, 16)).astype(np.float32)
    batches = [calib[:16], calib[16:]]
    return folded, calibrate(folded, batches, "minmax", rollback_small_channels=False), batches


def test_sharded_sensitivity_sweep_equals_the_single_process_one(residual, engine):
    folded, qp, batches = residual
    one = analyse(folded, qp, batches, bias_shift=True)
    many = analyse(folded, qp, batches, bias_shift=True, engine=engine)
    assert len(one.rows) == len(qp.ops) >= 3
    assert one.as_dict() == many.as_dict()
    assert one.bias_shift.keys() == many.bias_shift.keys()
    assert all(np.array_equal(one.bias_shift[k], many.bias_shift[k]) for k in one.bias_shift)


def test_a_missing_ray_is_reported_with_the_setting_and_the_extra(monkeypatch):
    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ConfigError, match=r"engine.ray_address = 'auto' needs Ray: pip install 'quantflow-ascend\[ray\]'"):
        shard.run(abs, None, [1, 2], EngineSection(workers=2, ray_address="auto"))


def test_where_says_where_the_work_runs():
    assert shard.where(EngineSection()) == "in this process"
    assert shard.where(TWO_PROCESSES) == "over 2 local worker processes"
    assert shard.where(LOCAL_RAY) == "over a local Ray runtime (2 shards)"
    assert shard.where(EngineSection(workers=8, ray_address="ray://head:10001")) == "over Ray at ray://head:10001 (8 shards)"
