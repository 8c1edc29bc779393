"""Per-channel input scales of depthwise convolutions (quantflow.quantization.channel_scale): which layers, the
scales against an independent computation, the float network unchanged, the emulation bit for bit the device's
arithmetic (the NumPy reference of the scheme) and every deploy graph, and the INT8 error lowered."""
from __future__ import annotations

import numpy as np
import pytest
from support import ascend_reference as ref
from support import deploy_interpreter

from quantflow.backends.deploy_mindspore import export_deploy_mindir
from quantflow.backends.deploy_onnx import deploy_model
from quantflow.engine.int8_emulator import Emulator
from quantflow.engine.runner import float_runner
from quantflow.frontends.mindir import read_mindir
from quantflow.ir import Graph, Node, TensorInfo
from quantflow.quantization import channel_scale, scheme
from quantflow.quantization.calibrater import calibrate
from quantflow.quantization.deploy import quantized_graph
from quantflow.quantization.qparams import QuantParams

N, C, H = 4, 24, 8
DW = {"pads": [1, 1, 1, 1], "strides": [1, 1], "dilations": [1, 1], "group": C}


def _spread() -> np.ndarray:
    """Per-channel input amplitudes 64x apart: one INT8 scale per tensor starves most channels."""
    return np.geomspace(1.0, 1.0 / 64, C)


def dw_net(seed: int = 0, multiplier: int = 1) -> Graph:
    """x (N, 24, 8, 8) -> depthwise 3x3 (channel multiplier ``multiplier``) -> out."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.3, (C * multiplier, 1, 3, 3)).astype(np.float32)
    b = rng.normal(0, 0.05, C * multiplier).astype(np.float32)
    node = Node("dw", "Conv2D", ["x", "dw.w", "dw.b"], ["out"], DW, scope="Default/dw")
    g = Graph([node], ["x"], ["out"], {"dw.w": w, "dw.b": b},
              {"x": TensorInfo((N, C, H, H)), "out": TensorInfo((N, C * multiplier, H, H))})
    g.check()
    return g


def pair_net(act: str, seed: int = 0, pointwise: bool = False) -> Graph:
    """x -> 1x1 conv (its output channels ``_spread`` apart) -> ``act`` -> depthwise (``pointwise``: a 1x1
    convolution, named dw all the same) -> out."""
    rng = np.random.default_rng(seed)
    w1 = (rng.normal(0, 0.3, (C, C, 1, 1)) * _spread()[:, None, None, None]).astype(np.float32)
    w2 = rng.normal(0, 0.3, (C, C, 1, 1) if pointwise else (C, 1, 3, 3)).astype(np.float32)
    inits = {"c1.w": w1, "c1.b": np.full(C, 0.01, np.float32), "dw.w": w2, "dw.b": np.zeros(C, np.float32)}
    one_by_one = {**DW, "pads": [0] * 4, "group": 1}
    nodes = [Node("c1", "Conv2D", ["x", "c1.w", "c1.b"], ["y1"], one_by_one, scope="Default/c1"),
             Node("a", act, ["y1"], ["z1"]),
             Node("dw", "Conv2D", ["z1", "dw.w", "dw.b"], ["out"], one_by_one if pointwise else DW,
                  scope="Default/dw")]
    shape = TensorInfo((N, C, H, H))
    g = Graph(nodes, ["x"], ["out"], inits, {"x": shape, "y1": shape, "z1": shape, "out": shape})
    g.check()
    return g


def images(seed: int, batches: int = 3, spread: bool = True) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    amp = _spread().reshape(1, C, 1, 1) if spread else 1.0
    return [(rng.normal(size=(N, C, H, H)) * 4 * amp).astype(np.float32) for _ in range(batches)]


def _sqnr(r: np.ndarray, q: np.ndarray) -> float:
    r, q = r.astype(np.float64), q.astype(np.float64)
    return float(10 * np.log10((r ** 2).sum() / ((r - q) ** 2).sum()))


def test_depthwise_scales_bring_every_channel_to_the_widest_range_in_float16():
    r = np.array([4.0, 1.0, 0.3, 0.0, 1e-6])
    m = channel_scale.scales_for(r, np.ones((5, 1, 3, 3)), 5)
    expected = np.array([1.0, 4.0, 4.0 / 0.3, 1.0, 4096.0])   # a dead channel 1, at most 4096
    np.testing.assert_array_equal(m, expected.astype(np.float16).astype(np.float32))
    assert channel_scale.scales_for(np.array([4.0, 3.0, 2.5, 1.0]), np.ones((4, 1, 3, 3)), 4) is None  # balanced


def test_other_convolutions_meet_activation_and_weight_ranges_halfway():
    """m_c ~ sqrt(weight range / activation range) of channel c (the weights relative to each output channel's
    largest), the widest scaled channel at the tensor's widest range: written out here for a 1x1 convolution."""
    rng = np.random.default_rng(0)
    r = np.array([8.0, 2.0, 0.5, 0.1, 0.05])
    w = rng.normal(size=(6, 5, 1, 1)) * np.array([1.0, 0.5, 2.0, 1.0, 0.1])[None, :, None, None]
    a = np.abs(w[:, :, 0, 0]) / np.abs(w[:, :, 0, 0]).max(axis=1, keepdims=True)
    ideal = np.sqrt(a.max(axis=0) / r)
    expected = ideal * r.max() / (r * ideal).max()
    np.testing.assert_array_equal(channel_scale.scales_for(r, w, 1),
                                  expected.astype(np.float16).astype(np.float32))


def test_every_weight_column_is_divided_by_the_scale_of_the_channel_it_reads():
    m = np.arange(1.0, 7.0)                                   # 6 input channels, 2 groups of 3
    d = channel_scale.divisors(m, (4, 3, 3, 3), 2)            # 4 outputs: 2 per group
    for o in range(4):
        for j in range(3):
            assert d[o, j, 0, 0] == m[(o // 2) * 3 + j]
    np.testing.assert_array_equal(channel_scale.divisors(m, (12, 1, 3, 3), 6)[:, 0, 0, 0], np.repeat(m, 2))


def test_only_layers_equalization_cannot_balance_are_chosen():
    assert set(channel_scale.choose(pair_net("HSwish"), {"c1", "dw"}, images(1, spread=False))) == {"dw"}
    assert set(channel_scale.choose(pair_net("HSwish", pointwise=True), {"c1", "dw"}, images(1, spread=False))) \
        == {"dw"}
    # a ReLU between: cross-layer equalization balances that tensor exactly, with no op added
    assert channel_scale.choose(pair_net("ReLU"), {"c1", "dw"}, images(1, spread=False)) == {}
    # not INT8 (skipped, or rolled back by CANN): nothing to scale
    assert channel_scale.choose(pair_net("HSwish"), {"c1"}, images(1, spread=False)) == {}
    # balanced channels: nothing to gain
    assert channel_scale.choose(dw_net(), {"dw"}, images(1, spread=False)) == {}


@pytest.mark.parametrize("multiplier", [1, 2])
def test_the_scaled_graph_computes_what_the_network_computes(multiplier):
    g = dw_net(multiplier=multiplier)
    m = channel_scale.choose(g, {"dw"}, images(1))["dw"]
    scaled = channel_scale.apply(g, {"dw": m})
    assert [n.op for n in scaled.nodes] == ["Mul", "Conv2D"]
    np.testing.assert_array_equal(scaled.initializers["dw:channel_scale"].ravel(), m)
    per_output = np.repeat(m, multiplier)   # output channel o reads input channel o // multiplier
    np.testing.assert_allclose(scaled.initializers["dw:channel_scaled_weight"] * per_output[:, None, None, None],
                               g.initializers["dw.w"], rtol=1e-6)
    assert channel_scale.apply(scaled, {"dw": m}) is scaled   # applying twice: the same graph
    x = images(2)[0]
    np.testing.assert_allclose(float_runner(scaled).run(x)["out"], float_runner(g).run(x)["out"],
                               rtol=1e-5, atol=1e-6)


def test_the_emulation_is_the_device_arithmetic_bit_for_bit():
    """The reference: float16 input times the float16 scale (one float16 rounding), AscendQuant, the exact
    integer depthwise convolution, AscendDequant (tests/support/ascend_reference.py)."""
    g = dw_net()
    qp = calibrate(g, images(1), "minmax", channel_scale=True)
    assert set(qp.channel_scales) == {"dw"}
    (q,) = qp.ops
    m = qp.channel_scales["dw"]
    # the int8 weights: the float weights divided by the float16 scale (stored float32), on the scheme's grid
    divided = (g.initializers["dw.w"].astype(np.float64) / m[:, None, None, None]).astype(np.float32)
    w_q, scale_w = scheme.quantize_weight(divided, 0, g.initializers["dw.b"], q.scale_d)
    np.testing.assert_array_equal(q.weight, w_q)
    np.testing.assert_array_equal(q.scale_w, scale_w)
    x16 = images(2)[0].astype(np.float16)
    scaled16 = (x16.astype(np.float32) * m.astype(np.float16).astype(np.float32).reshape(1, C, 1, 1)).astype(
        np.float16)
    expected = ref.quantized_conv(scaled16, q, {**DW, "pads": (1, 1, 1, 1)})
    np.testing.assert_array_equal(Emulator(quantized_graph(g, qp)).logits(x16), expected.astype(np.float32))


def test_per_channel_scales_lower_the_int8_error():
    g = dw_net()
    x = np.concatenate(images(2))
    fp = float_runner(g).run(x)["out"]
    whole, narrow = {}, {}
    for on in (False, True):
        qp = calibrate(g, images(1), "minmax", channel_scale=on)
        q = Emulator(quantized_graph(g, qp)).logits(x.astype(np.float16))
        whole[on], narrow[on] = _sqnr(fp, q), _sqnr(fp[:, C // 2:], q[:, C // 2:])   # the narrower half
    assert whole[True] > whole[False] + 5
    assert narrow[True] > narrow[False] + 15


@pytest.mark.parametrize("pointwise", [False, True])
def test_the_scales_are_in_every_deploy_graph_and_survive_a_save(tmp_path, pointwise):
    g = pair_net("HSwish", pointwise=pointwise)
    qp = calibrate(g, images(1, spread=False), "minmax", channel_scale=True)
    assert set(qp.channel_scales) == {"dw"}
    qp.save(tmp_path / "q")
    back = QuantParams.load(tmp_path / "q")
    np.testing.assert_array_equal(back.channel_scales["dw"], qp.channel_scales["dw"])
    deploy = quantized_graph(g, back)
    ops = [n.op for n in deploy.nodes]
    assert ops[ops.index("Mul") + 1] == "Quant"     # the Mul feeds the AscendQuant: Quant -> cube stays adjacent
    x16 = images(4, 1, spread=False)[0].astype(np.float16)
    emulated = Emulator(deploy).logits(x16)
    np.testing.assert_array_equal(emulated, Emulator(quantized_graph(g, qp)).logits(x16))
    np.testing.assert_array_equal(deploy_interpreter.run(deploy_model(deploy, "x"), x16)[0], emulated)
    export_deploy_mindir(deploy, tmp_path)
    np.testing.assert_array_equal(Emulator(read_mindir(tmp_path / "deploy.mindir")).logits(x16), emulated)
    # left in float16 later (a fallback), a layer keeps its scaled weights after the Mul: the float network
    fp = float_runner(g).run(x16.astype(np.float32))["out"]
    floating = quantized_graph(g, back.only([]))
    assert "Mul" in [n.op for n in floating.nodes] and "Quant" not in [n.op for n in floating.nodes]
    assert _sqnr(fp, Emulator(floating).logits(x16)) > 50


def test_a_layer_the_fallback_leaves_in_float16_drops_its_scales_and_computes_as_the_float16_path():
    from dataclasses import replace

    g = pair_net("HSwish")
    qp = calibrate(g, images(1, spread=False), "minmax", channel_scale=True)
    assert set(qp.channel_scales) == {"dw"}
    back = qp.without(["dw", "c1"], "rolled back")
    assert back.channel_scales == {} and {f.node for f in back.float16} >= {"dw", "c1"}
    graph = quantized_graph(g, back)
    assert [n.op for n in graph.nodes if n.op in ("Mul", "Quant")] == []
    x16 = images(4, 1, spread=False)[0].astype(np.float16)
    float16_path = quantized_graph(g, replace(qp, ops=[], channel_scales={}))   # no INT8, the network's weights
    np.testing.assert_array_equal(Emulator(graph).logits(x16), Emulator(float16_path).logits(x16))
    # where the recovery rewrote the layer's float weights on the scaled graph, its scales stay with them
    kept = replace(qp, float_weights={"dw": {"weight": channel_scale.apply(g, qp.channel_scales).initializers[
        "dw:channel_scaled_weight"]}}).without(["dw"], "rolled back")
    assert set(kept.channel_scales) == {"dw"}
