"""The INT8-simulating MindSpore network against the integer emulator.

Two independent implementations of the same INT8 model -- MindSpore's own Conv2d/Dense/pooling
kernels on int8-grid values, and the NumPy integer emulator -- must agree on every output.
"""
import json
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from quantflow import emulator
from quantflow.calibrate import calibrate, load_quant_params
from quantflow.export import export_models
from quantflow.gate import load_eval_set
from quantflow.qdq import build_qdq_network
from test_emulator import small_net


def assert_same_int8_model(got, ref):
    """Equal up to float rounding, except where float noise decides a rounding tie in some layer
    differently (one int8 step there): such flips must stay rare and small."""
    scale = np.abs(ref).max()
    off = np.abs(got - ref) > 1e-4 * scale
    assert off.mean() <= 0.03, f"{off.mean():.2%} of the outputs differ"
    assert np.abs(got - ref).max() <= 0.01 * scale
    assert (got.argmax(1) == ref.argmax(1)).mean() >= 0.98


@pytest.mark.parametrize("method", ["minmax", "percentile", "kl"])
def test_qdq_network_reproduces_the_emulator(method):
    net = small_net(7)
    x = np.random.default_rng(2).normal(size=(64, 3, 16, 16)).astype(np.float32)
    model = calibrate(net, x[:32], (1, 3, 16, 16), method, percentile=99.9, bins=1024)
    qdq = build_qdq_network(model)
    got = qdq(Tensor(x[32:])).asnumpy()
    ref = emulator.run(model, x[32:])
    assert_same_int8_model(got, ref)


def test_demo_int8sim_export_matches_the_gated_model(built_demo, demo_cfg, tmp_path):
    kdir = Path(json.loads((built_demo[0] / "build" / "latest.json").read_text())["artifacts"])
    model = load_quant_params(kdir)
    batches, labels = load_eval_set(demo_cfg)
    x = next(iter(batches))
    graph = nn.GraphCell(ms.load(str(kdir / "model_int8sim.mindir")))
    got = np.concatenate([graph(Tensor(x[i:i + 1])).asnumpy() for i in range(len(x))])
    ref = emulator.run(model, x)
    assert_same_int8_model(got, ref)
