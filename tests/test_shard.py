"""Sharded evaluation (engine.workers, engine.ray_address) gives the single process's numbers bit for bit."""
from __future__ import annotations

import builtins
import json
from pathlib import Path

import numpy as np
import pytest

import nets
from quantflow.backends.aipp import parse
from quantflow.config import EngineSection
from quantflow.engine import shard
from quantflow.errors import ConfigError
from quantflow.frontends.mindir import read_mindir
from quantflow.pipeline.gate import fp32_logits, int8_logits
from quantflow.quantization.calibrater import calibrate
from quantflow.quantization.passes import fold_for_quantization
from quantflow.quantization.qparams import QuantParams
from quantflow.quantization.sensitivity import analyse

TWO_PROCESSES = EngineSection(workers=2)
LOCAL_RAY = EngineSection(workers=2, ray_address="local")


def test_split_cuts_contiguous_runs_on_batch_boundaries():
    assert shard.split(1000, 2, 64) == [range(0, 512), range(512, 1000)]
    assert shard.split(10, 3) == [range(0, 4), range(4, 8), range(8, 10)]
    assert shard.split(5, 4, 8) == [range(0, 5)]
    assert [i for r in shard.split(359, 3, 32) for i in r] == list(range(359))


@pytest.fixture(scope="module")
def demo(built_demo, demo_cfg):
    dirs = {k: Path(v) for k, v in json.loads((built_demo[0] / "build" / "latest.json").read_text())["artifacts"].items()}
    graph = read_mindir(dirs["graph"] / "model.mindir")
    cfg = demo_cfg.model_copy(update={"evaluation": demo_cfg.evaluation.model_copy(update={"batch_size": 32})})
    qp = QuantParams.load(dirs["fallback"])
    aipp = parse((dirs["aipp"] / "aipp.cfg").read_text())
    fp, labels = fp32_logits(cfg, graph)
    q = int8_logits(cfg, fold_for_quantization(graph), qp, aipp)
    return cfg, graph, qp, aipp, fp, labels, q


def _with(cfg, engine):
    return cfg.model_copy(update={"engine": engine})


@pytest.mark.parametrize("engine", [TWO_PROCESSES, LOCAL_RAY], ids=["processes", "ray"])
def test_sharded_gate_logits_equal_the_single_process_ones(demo, engine):
    import ray

    cfg, graph, qp, aipp, fp, labels, q = demo
    try:
        fp_s, labels_s = fp32_logits(_with(cfg, engine), graph)
        q_s = int8_logits(_with(cfg, engine), fold_for_quantization(graph), qp, aipp)
    finally:
        ray.shutdown()
    assert len(fp) == len(labels) == 359
    assert np.array_equal(fp_s, fp) and np.array_equal(labels_s, labels) and np.array_equal(q_s, q)


@pytest.fixture(scope="module")
def residual(tmp_path_factory):
    path = nets.export(nets.ResidualNet(), tmp_path_factory.mktemp("shard") / "res.mindir")
    folded = fold_for_quantization(read_mindir(path))
    calib = np.random.default_rng(1).normal(size=(32, 3, 16, 16)).astype(np.float32)
    batches = [calib[:16], calib[16:]]
    return folded, calibrate(folded, batches, "minmax"), batches


@pytest.mark.parametrize("engine", [TWO_PROCESSES, LOCAL_RAY], ids=["processes", "ray"])
def test_sharded_sensitivity_sweep_equals_the_single_process_one(residual, engine):
    import ray

    folded, qp, batches = residual
    one = analyse(folded, qp, batches, bias_shift=True)
    try:
        many = analyse(folded, qp, batches, bias_shift=True, engine=engine)
    finally:
        ray.shutdown()
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
    with pytest.raises(ConfigError, match=r"engine.ray_address = 'auto' needs Ray: pip install 'quantflow\[ray\]'"):
        shard.run(abs, None, [1, 2], EngineSection(workers=2, ray_address="auto"))


def test_where_says_where_the_work_runs():
    assert shard.where(EngineSection()) == "in this process"
    assert shard.where(TWO_PROCESSES) == "over 2 local worker processes"
    assert shard.where(LOCAL_RAY) == "over Ray (local, 2 shards)"
