"""The INT8 emulator against the independent NumPy reference of the Ascend scheme, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
from support import ascend_reference as ref
from support import nets

from quantflow.engine.int8_emulator import Emulator
from quantflow.engine.lowering import lower
from quantflow.engine.runner import Runner, float_runner
from quantflow.errors import UnsupportedNetworkError
from quantflow.frontends.mindir import read_mindir
from quantflow.ir import Graph, Node, TensorInfo
from quantflow.quantization import scheme
from quantflow.quantization.calibrater import Calibrater, calibrate, quantize
from quantflow.quantization.deploy import quantized_graph
from quantflow.quantization.passes import fold_for_quantization
from quantflow.quantization.qparams import QuantizedOp, QuantParams


@pytest.fixture(scope="module")
def residual(tmp_path_factory):
    path = nets.export(nets.ResidualNet(), tmp_path_factory.mktemp("res") / "res.mindir")
    graph = read_mindir(path)
    folded = fold_for_quantization(graph)
    rng = np.random.default_rng(1)
    calib = rng.normal(size=(32, 3, 16, 16)).astype(np.float32)
    qp = calibrate(folded, [calib[:16], calib[16:]], "minmax", rollback_small_channels=False)
    return graph, folded, qp


def reference_forward(x16: np.ndarray, qp) -> np.ndarray:
    """ResidualNet by hand: its layers, pads and fused activations as written in tests/nets.py."""
    c1, dw, pw, fc = qp.ops
    same3 = {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)}
    y1 = ref.relu(ref.quantized_conv(x16, c1, {**same3, "group": 1}))
    y2 = ref.relu6(ref.quantized_conv(y1, dw, {**same3, "group": 8}))
    y3 = ref.quantized_conv(y2, pw, {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "group": 1})
    y4 = ref.add(y1, y3)
    y6 = ref.mean_hw(ref.max_pool(y4, (2, 2), (2, 2), (0, 0, 0, 0)))
    return ref.quantized_dense(y6.reshape(len(y6), -1), fc, transpose_b=True)


def test_quantized_ops_are_the_convolutions_and_the_dense(residual):
    _, folded, qp = residual
    assert [q.op for q in qp.ops] == ["Conv2D", "Conv2D", "Conv2D", "MatMul"]
    assert [q.relu for q in qp.ops] == [True, False, False, False]   # ReLU6 is not AscendDequant's relu_flag
    assert "BatchNorm" not in folded.op_counts()
    for q in qp.ops:
        assert q.weight.dtype == np.int8 and np.abs(q.weight).max() == 127
        assert q.bias.dtype == np.int32 and q.deq_scale.dtype == np.float32
        assert -128 <= q.offset_d <= 127 and q.node and q.scope.startswith("Default/")
        np.testing.assert_array_equal(q.deq_scale, (q.scale_d * q.scale_w).astype(np.float32))


def test_emulation_is_bit_exact_against_the_reference(residual):
    _, folded, qp = residual
    x16 = np.random.default_rng(2).normal(size=(24, 3, 16, 16)).astype(np.float16)
    got = Emulator(quantized_graph(folded, qp)).logits(x16)
    want = reference_forward(x16, qp).astype(np.float32)
    assert got.dtype == np.float32 and np.all(got.astype(np.float16) == got)  # float16 values
    np.testing.assert_array_equal(got, want)


def test_optimized_emulation_keeps_every_rounding_and_equals_the_unoptimized_graph(residual):
    _, folded, qp = residual
    emulator = Emulator(quantized_graph(folded, qp))
    assert emulator.optimized  # onnxruntime's rewrites passed the vetting on this residual/depthwise net
    model = lower(emulator.graph, "float16")
    plain = Runner(model, model.graph.input[0].name, emulator.batch, optimize=False, input_dtype=np.float16)
    x16 = np.random.default_rng(6).normal(size=(16, 3, 16, 16)).astype(np.float16)
    np.testing.assert_array_equal(emulator.logits(x16), plain.run(x16)[folded.outputs[0]])


def test_a_vetting_that_refuses_runs_the_graph_unoptimized(residual):
    _, folded, qp = residual
    model = lower(quantized_graph(folded, qp), "float16")
    feed = model.graph.input[0].name
    assert not Runner(model, feed, 16, keeps=lambda optimized: False).optimized
    assert Runner(model, feed, 16, keeps=lambda optimized: True).optimized


def test_emulation_tracks_fp32(residual):
    graph, folded, qp = residual
    x = np.random.default_rng(3).normal(size=(32, 3, 16, 16)).astype(np.float32)
    fp = float_runner(graph).run(x)[graph.outputs[0]]
    q = Emulator(quantized_graph(folded, qp)).logits(x.astype(np.float16))
    assert np.abs(fp - q).max() < 0.05 * np.abs(fp).max()
    assert np.abs(fp - q).max() > 0  # it is a quantized result, not the float one


def single_conv(weight: np.ndarray, pads=(0, 0, 0, 0)) -> Graph:
    """An IR graph holding one Conv2D (N=4, stride 1), built directly."""
    o, c, kh, kw = weight.shape
    h = 6
    oh, ow = h + pads[0] + pads[2] - kh + 1, h + pads[1] + pads[3] - kw + 1
    node = Node("conv", "Conv2D", ["x", "w"], ["y"], {"pads": list(pads), "strides": [1, 1], "dilations": [1, 1],
                                                      "group": 1}, scope="Default/conv")
    return Graph([node], ["x"], ["y"], {"w": weight.astype(np.float32)},
                 {"x": TensorInfo((4, c, h, h)), "y": TensorInfo((4, o, oh, ow))})


def test_quant_rounds_half_to_even_and_saturates():
    graph = single_conv(np.ones((1, 1, 1, 1)))
    q = QuantizedOp("conv", "Default/conv", "Conv2D", "x", 1.0, 0, np.ones(1), 0, np.ones((1, 1, 1, 1), np.int8),
                    np.zeros(1, np.int32), np.ones(1, np.float32))
    x = np.zeros((4, 1, 6, 6), np.float16)
    x[0, 0, 0, :6] = [2.5, 3.5, -2.5, -3.5, 1000.0, -1000.0]
    y = Emulator(quantized_graph(graph, QuantParams("minmax", [q]))).logits(x)
    np.testing.assert_array_equal(y[0, 0, 0, :6], [2, 4, -2, -4, 127, -128])


def test_large_layers_stay_exact_beyond_float32_integers():
    # 256 input channels of +-127 weights: sum|w_q| * 255 exceeds 2**24, where a float32 accumulator
    # would round; the integer cube must not
    rng = np.random.default_rng(4)
    w = np.sign(rng.normal(size=(4, 256, 3, 3))) * rng.uniform(0.9, 1.0, (4, 256, 3, 3))
    graph = single_conv(w, pads=(1, 1, 1, 1))
    x = rng.normal(size=(64, 3, 6, 6)).astype(np.float32)  # calibration data for the 256-channel input
    x = np.repeat(x, 86, axis=1)[:, :256]
    qp = quantize(graph, {"x": (float(x.min()), float(x.max()))}, "minmax", rollback_small_channels=False)
    q = qp.ops[0]
    assert np.abs(q.weight.astype(np.int64)).sum(axis=(1, 2, 3)).max() * 255 > 2 ** 24
    x16 = x[:4].astype(np.float16)
    got = Emulator(quantized_graph(graph, qp)).logits(x16)
    want = ref.quantized_conv(x16, q, {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "group": 1})
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_bias_beyond_int32_names_the_layer():
    with pytest.raises(UnsupportedNetworkError, match="layer Default/fc: bias of output channel 1"):
        scheme.quantize_bias(np.array([0.0, 1e6]), 1e-3, np.array([1e-4, 1e-4]), "Default/fc")


def test_activation_parameters_cover_zero_and_map_the_range():
    s, off = scheme.act_qparams(0.0, 2.55)
    assert off == -128 and s == pytest.approx(0.01)
    s, off = scheme.act_qparams(-1.0, 1.0)
    assert s == pytest.approx(2 / 255) and off == 0
    s, off = scheme.act_qparams(0.5, 1.0)   # widened to hold 0
    assert off == -128 and s == pytest.approx(1 / 255)
    assert scheme.act_qparams(0.0, 0.0)[0] == scheme.MIN_SCALE_D


def test_ops_reading_one_tensor_share_its_observer(tmp_path):
    graph = fold_for_quantization(read_mindir(nets.export(nets.DenseNetStyle(), tmp_path / "d.mindir")))
    cal = Calibrater(graph)
    assert len(cal.tensors) == len(set(n.inputs[0] for n in cal.nodes)) <= len(cal.nodes)
    x = np.random.default_rng(5).normal(size=(8, 3, 16, 16)).astype(np.float32)
    cal.collect([x])
    assert cal.images == 8  # the histogram pass read the range pass's activations
    for t, (lo, hi) in cal.ranges("minmax").items():
        assert lo <= hi and cal.observers[t].count > 0


def test_the_histogram_pass_sees_the_same_activations_kept_or_run_again(tmp_path, monkeypatch):
    from quantflow.quantization import calibrater

    graph = fold_for_quantization(read_mindir(nets.export(nets.ResNetStyle(), tmp_path / "r.mindir")))
    batches = [np.random.default_rng(i).normal(size=(4, 3, 16, 16)).astype(np.float32) for i in range(3)]
    kept = Calibrater(graph, rollback_small_channels=False)
    kept.collect(batches)
    monkeypatch.setattr(calibrater, "KEPT_BYTES", 0)   # nothing fits: the network runs again
    again = Calibrater(graph, rollback_small_channels=False)
    again.collect(batches)
    assert (kept.images, again.images) == (12, 24) and len(kept.observers) > 3
    for t, obs in kept.observers.items():
        assert np.array_equal(obs.hist_signed, again.observers[t].hist_signed) and obs.hist_signed.sum() > 0
        assert np.array_equal(obs.hist_abs, again.observers[t].hist_abs)
    assert kept.ranges("mse") == again.ranges("mse")


@pytest.mark.parametrize("name", ["ResNetStyle", "MobileNetV3Style", "DenseNetStyle", "ShuffleNetStyle", "OpZoo"])
def test_every_style_quantizes_and_emulates_close_to_fp32(tmp_path, name):
    graph = read_mindir(nets.export(getattr(nets, name)(), tmp_path / f"{name}.mindir"))
    folded = fold_for_quantization(graph)
    rng = np.random.default_rng(6)
    calib = rng.normal(size=(32, 3, 16, 16)).astype(np.float32)
    qp = calibrate(folded, [calib], "minmax", rollback_small_channels=False)
    assert len(qp.ops) == sum(1 for n in folded.nodes if n.op in ("Conv2D", "MatMul"))
    x = rng.normal(size=(16, 3, 16, 16)).astype(np.float32)
    fp = float_runner(graph).run(x)[graph.outputs[0]]
    q = Emulator(quantized_graph(folded, qp)).logits(x.astype(np.float16))
    err = np.abs(fp - q).max() / np.abs(fp).max()
    assert 0 < err < 0.1, err


def test_the_emulation_of_a_suffix_continues_the_full_one_bit_for_bit(residual):
    """Graph.suffix(k) fed with the full emulation's values of the tensors it reads gives the same
    output: the per-layer analysis runs only what follows a layer."""
    _, folded, qp = residual
    deploy = quantized_graph(folded, qp)
    x16 = np.random.default_rng(5).normal(size=(8, 3, 16, 16)).astype(np.float16)
    inner = [o for n in deploy.nodes for o in n.outputs if deploy.tensors[o].dtype == "float32"]
    full = Emulator(deploy, extra_outputs=inner).outputs(x16, inner + deploy.outputs)
    starts = [k for k, n in enumerate(deploy.nodes) if n.op == "Quant"][1:] + [len(deploy.nodes) - 3]
    assert len(starts) >= 3
    for k in starts:
        tail = deploy.suffix(k)
        assert len(tail.inputs) >= 1 and all(i in full for i in tail.inputs), tail.inputs
        tail.check()
        got = Emulator(tail).logits({i: full[i] for i in tail.inputs})
        np.testing.assert_array_equal(got, full[deploy.outputs[0]])
    residual_cut = deploy.suffix(next(k for k, n in enumerate(deploy.nodes) if n.op == "Add") - 3)
    assert len(residual_cut.inputs) == 2  # the skip connection crosses the cut
