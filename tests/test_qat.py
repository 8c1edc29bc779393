"""The fake-quant network (``quantflow.quantization.qat``) against the INT8 emulator on the demo (DigitsNet, the
repository's quantflow.toml): the same forward, element for element equal or one float16 ulp apart where the
arithmetic order differs (the scales in float32 here, float64 in the scheme; module doc), and gradients that
reach every trained parameter."""
from __future__ import annotations

import numpy as np
import pytest

from quantflow.engine.int8_emulator import Emulator
from quantflow.quantization.calibrater import calibrate
from quantflow.quantization.deploy import quantized_graph


@pytest.fixture(scope="module")
def demo(demo_cfg, demo_net, tmp_path_factory):
    """The demo's folded graph, 64 calibration images (float16 values, as AIPP gives them) and held-out ones."""
    import mindspore as ms

    from quantflow.frontends.mindir import read_mindir
    from quantflow.quantization.passes import fold_for_quantization
    from tasks.inputs import image_batches

    folder = tmp_path_factory.mktemp("qat")
    ms.export(demo_net, ms.Tensor(np.zeros(demo_cfg.model.input_shape, np.float32)),
              file_name=str(folder / "demo"), file_format="MINDIR")
    graph = fold_for_quantization(read_mindir(folder / "demo.mindir"))
    paths = sorted(demo_cfg.path(demo_cfg.calibration.data_dir).rglob("*.png"))[::3][:96]
    assert len(paths) == 96
    x = np.concatenate(list(image_batches(demo_cfg, paths, 32)))
    return graph, x[:64], x[64:], folder


def ulps16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many float16 steps apart the float16 values ``a`` and ``b`` are (elementwise)."""
    def ordered(v):
        i = np.asarray(v, np.float16).view(np.int16).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFF), i)
    return np.abs(ordered(a) - ordered(b))


@pytest.mark.parametrize("rollback", [True, False], ids=["device-rollback", "every-op-int8"])
def test_forward_equals_the_emulator_within_one_float16_ulp(demo, rollback):
    import mindspore as ms

    from quantflow.quantization.qat import FakeQuantNet

    graph, calib, held, folder = demo
    qp = calibrate(graph, [calib[:32], calib[32:]], "mse", rollback_small_channels=rollback)
    # DigitsNet: CANN rolls back the stem (3 channels); its other two convolutions and the Dense layers stay INT8
    assert [q.op for q in qp.ops] == ["Conv2D"] * (2 if rollback else 3) + ["MatMul"] * 2
    net = FakeQuantNet(graph, qp, folder / f"net-{rollback}")
    x16 = held.astype(np.float16)
    want = Emulator(quantized_graph(graph, qp)).logits(x16)
    got = net.cell(ms.Tensor(x16.astype(np.float32))).asnumpy()
    assert got.shape == want.shape and np.all(got.astype(np.float16) == got)  # float16 values
    apart = ulps16(got, want)
    assert apart.max() <= 1, f"{int((apart > 1).sum())} elements more than one float16 ulp apart"
    assert (apart == 0).mean() >= 0.99   # equal but where a scale's float32 arithmetic rounds otherwise


def test_requantizing_the_untrained_network_gives_the_calibrated_parameters(demo):
    from quantflow.quantization.qat import FakeQuantNet

    graph, calib, _, folder = demo
    qp = calibrate(graph, [calib], "minmax", rollback_small_channels=False)
    again = FakeQuantNet(graph, qp, folder / "again").requantized()
    for a, b in zip(qp.ops, again.ops):
        assert (a.scale_d, a.offset_d) == (b.scale_d, b.offset_d)
        np.testing.assert_array_equal(a.weight, b.weight)
        np.testing.assert_array_equal(a.bias, b.bias)
        np.testing.assert_array_equal(a.deq_scale, b.deq_scale)


def test_every_trained_parameter_gets_a_gradient(demo):
    import mindspore as ms

    from quantflow.quantization.qat import FakeQuantNet

    graph, calib, _, folder = demo
    qp = calibrate(graph, [calib], "minmax", rollback_small_channels=False)
    net = FakeQuantNet(graph, qp, folder / "grad", learn_ranges=True)
    x = ms.Tensor(calib[:16])
    grads = ms.grad(lambda x: net.cell(x).square().mean(), None, net.trainable)(x)
    assert len(grads) == 2 * len(qp.ops) + 2 * len(net.tensors)
    assert all(np.isfinite(g.asnumpy()).all() and np.abs(g.asnumpy()).max() > 0 for g in grads)


def test_the_distillation_loss_weighs_each_part_by_its_own_energy():
    import mindspore as ms

    from quantflow.evaluation.parts import Region, finest
    from quantflow.quantization.retraining import DistillLoss

    rng = np.random.default_rng(0)
    boxes = rng.normal(scale=100.0, size=(8, 4, 5)).astype(np.float32)     # a detector's boxes, in pixels
    scores = rng.uniform(size=(8, 3, 5)).astype(np.float32)               # its scores, 0..1
    teacher = {"out": np.concatenate([boxes, scores], axis=1), "aux": rng.normal(size=(8, 2)).astype(np.float32)}
    regions = [Region("out", "out", (8, 7, 5)), Region("boxes", "out", (8, 4, 5), 1, 0, 4, "boxes"),
               Region("scores", "out", (8, 3, 5), 1, 4, 7, "scores"), Region("aux", "aux", (8, 2))]
    loss = DistillLoss(finest(regions), ["out", "aux"], teacher)
    assert [t[3] for t in loss.terms] == ["boxes", "scores", "aux"]   # the split output by its parts only
    student = [teacher["out"] + 0.1, teacher["aux"] - 0.1]
    want = sum(0.01 / np.mean(np.square(t, dtype=np.float64)) for t in (boxes, scores, teacher["aux"]))
    assert loss.numpy(student) == pytest.approx(want, rel=1e-5)
    got = loss.mindspore(tuple(ms.Tensor(s) for s in student), tuple(ms.Tensor(t) for t in loss.teacher))
    assert float(got.asnumpy()) == pytest.approx(want, rel=1e-4)


def pair_net(seed: int = 0):
    """x -> c0 -> ReLU6 -> c1 (depthwise) -> ReLU -> c2, in the IR: two pairs whose channels can be rescaled."""
    from test_recovery import H, N, _conv

    from quantflow.ir import Graph, Node, TensorInfo

    rng = np.random.default_rng(seed)
    w = {"c0": rng.normal(0, 0.3, (16, 8, 3, 3)), "c1": rng.normal(0, 0.3, (16, 1, 3, 3)),
         "c2": rng.normal(0, 0.3, (10, 16, 1, 1))}
    b = {k: rng.normal(0, 0.1, v.shape[0]) for k, v in w.items()}
    nodes = [_conv("c0", "x", "y0", w["c0"], b["c0"], pad=1), Node("a0", "ReLU6", ["y0"], ["z0"]),
             _conv("c1", "z0", "y1", w["c1"], b["c1"], group=16, pad=1), Node("a1", "ReLU", ["y1"], ["z1"]),
             _conv("c2", "z1", "out", w["c2"], b["c2"])]
    inits = {f"{k}.{p}": v.astype(np.float32) for p, d in (("w", w), ("b", b)) for k, v in d.items()}
    tensors = {"x": TensorInfo((N, 8, H, H))}
    for n in nodes:
        cout = inits[f"{n.name}.w"].shape[0] if n.op == "Conv2D" else None
        tensors[n.outputs[0]] = TensorInfo((N, cout or tensors[n.inputs[0]].shape[1], H, H))
    g = Graph(nodes, ["x"], ["out"], inits, tensors)
    g.check()
    return g


def test_learned_channel_scales_are_exported_as_the_network_computes_them(tmp_path):
    """learn_scales: a scale per channel between c0 / c1 (through the ReLU6) and c1 / c2 (through the ReLU).  At
    u = 0 the network is the one without scales, bit for bit; with scales set, what it computes is what the
    emulator computes with ``requantized``'s parameters (the scheme's quantization of ``learned``'s rescaled
    weights), and the float network of those weights is the original where the activation between is a ReLU."""
    import mindspore as ms
    from dataclasses import replace
    from test_recovery import images

    from quantflow.engine.runner import float_runner
    from quantflow.quantization.qat import FakeQuantNet

    g = pair_net()
    calib = images(2)
    qp = calibrate(g, calib, "minmax", rollback_small_channels=False)
    net = FakeQuantNet(g, qp, tmp_path / "net", learn_scales=True)
    assert [p.describe() for p in net.pairs] == ["Default/c0 -> ReLU6 -> Default/c1", "Default/c1 -> ReLU -> Default/c2"]
    x = calib[0].astype(np.float16)
    got = net.cell(ms.Tensor(x.astype(np.float32))).asnumpy()
    np.testing.assert_array_equal(got, Emulator(quantized_graph(g, qp)).logits(x))

    def float_net(values):
        return replace(qp, float_weights={n: {"weight": v["weight"], "bias": v["bias"]} for n, v in values.items()})

    before = net.learned()
    u0, u1 = net.scale_parameters()
    rng = np.random.default_rng(0)
    u1.set_data(ms.Tensor(rng.normal(0, 0.7, u1.shape).astype(np.float32)))   # through the ReLU: exact in float
    learned = net.learned()
    s = np.exp(u1.asnumpy().astype(np.float64))
    np.testing.assert_allclose(learned["c1"]["bias"], before["c1"]["bias"] * s, rtol=1e-6)
    np.testing.assert_allclose(learned["c1"]["weight"], before["c1"]["weight"] * s[:, None, None, None], rtol=1e-6)
    np.testing.assert_allclose(learned["c2"]["weight"], before["c2"]["weight"] / s[None, :, None, None], rtol=1e-6)
    ref = float_runner(float_net(before).apply(g)).run(calib[0])["out"]
    again = float_runner(float_net(learned).apply(g)).run(calib[0])["out"]
    np.testing.assert_allclose(again, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())

    u0.set_data(ms.Tensor(rng.normal(0, 0.7, u0.shape).astype(np.float32)))
    got = net.cell(ms.Tensor(x.astype(np.float32))).asnumpy()
    apart = ulps16(got, Emulator(quantized_graph(g, net.requantized())).logits(x))
    assert apart.max() <= 1 and (apart == 0).mean() >= 0.99

    grads = ms.grad(lambda v: net.cell(v).square().mean(), None, net.trainable)(ms.Tensor(calib[0]))
    assert len(grads) == 2 * len(qp.ops) + 2 and all(np.abs(gr.asnumpy()).max() > 0 for gr in grads[-2:])


def test_the_channel_scales_can_start_at_equalization(tmp_path):
    """scales_init = "equalize" (retraining.equalized_start) on a network whose c2 input channels are 256x apart:
    the start is equalization's float weights calibrated again, the FP32 network unchanged, the INT8 error far
    below the calibrated parameters', and the fake-quant network built on it computes what the emulator does."""
    import mindspore as ms
    from test_recovery import chain_net, images

    from quantflow.engine.runner import float_runner
    from quantflow.quantization.qat import FakeQuantNet
    from quantflow.quantization.retraining import equalized_start

    g, calib = chain_net(), images(3)
    int8 = ["c1", "c2", "c3", "c4", "c5"]
    qp = calibrate(g, calib, "minmax", skip=["c0"], rollback_small_channels=False)
    assert [q.node for q in qp.ops] == int8

    def recalibrate(r):
        return calibrate(r.apply(g), calib, "minmax", skip=["c0"], rollback_small_channels=False)

    start, record = equalized_start(g, qp, calib, recalibrate)
    assert "c2" in {p["l2"] for p in record["pairs"]} and set(start.float_weights) >= {"c1", "c2"}
    x = np.concatenate(images(4))
    ref = float_runner(g).run(x)["out"].astype(np.float64)
    np.testing.assert_allclose(float_runner(start.apply(g)).run(x)["out"], ref, rtol=1e-5,
                               atol=1e-5 * np.abs(ref).max())

    def error(params):
        got = Emulator(quantized_graph(params.apply(g), params)).logits(x.astype(np.float16))
        return float(((got - ref) ** 2).sum() / (ref ** 2).sum())
    assert error(start) < error(qp) / 10

    net = FakeQuantNet(start.apply(g), start, tmp_path / "net", learn_scales=True)
    assert {p.l2.name for p in net.pairs} >= {"c2"}
    x16 = x.astype(np.float16)
    got = net.cell(ms.Tensor(x16.astype(np.float32))).asnumpy()
    want = Emulator(quantized_graph(start.apply(g), start)).logits(x16)
    # MindSpore's SiLU / PReLU and onnxruntime's differ by a float16 ulp on some elements, and a rounding that flips
    # after them moves an output by a quantization step: most elements equal, the same error against FP32
    assert (ulps16(got, want) == 0).mean() >= 0.9

    def relative(v):
        return float(((v.astype(np.float64) - ref) ** 2).sum() / (ref ** 2).sum())
    assert relative(got) == pytest.approx(relative(want), rel=0.05)


def test_a_split_and_a_slice_of_the_batch_train_at_any_batch(tmp_path):
    """YOLOv8's head: a Split (several outputs) and a slice over the whole exported batch (``0:1`` of axis 0).  The
    fake-quant network takes batches of any size and computes there what the emulator computes on each image."""
    import mindspore as ms
    from test_recovery import H, _conv, images

    from quantflow.ir import Graph, Node, TensorInfo
    from quantflow.quantization.qat import FakeQuantNet

    rng = np.random.default_rng(0)
    w0, w1 = rng.normal(0, 0.3, (32, 8, 3, 3)), rng.normal(0, 0.3, (8, 16, 1, 1))
    nodes = [_conv("c0", "x", "y0", w0, pad=1),
             Node("s", "Split", ["y0"], ["a", "b"], {"axis": 1, "sizes": [16, 16]}),
             _conv("c1", "a", "y1", w1),
             Node("t", "StridedSlice", ["b"], ["bt"], {"starts": [0, 0], "ends": [1, 8], "axes": [0, 1],
                                                       "steps": [1, 1], "squeeze": []}),
             Node("m", "Add", ["y1", "bt"], ["out"])]
    g = Graph(nodes, ["x"], ["out"], {"c0.w": w0.astype(np.float32), "c1.w": w1.astype(np.float32)},
              {"x": TensorInfo((1, 8, H, H)), "y0": TensorInfo((1, 32, H, H)), "a": TensorInfo((1, 16, H, H)),
               "b": TensorInfo((1, 16, H, H)), "y1": TensorInfo((1, 8, H, H)), "bt": TensorInfo((1, 8, H, H)),
               "out": TensorInfo((1, 8, H, H))})
    g.check()
    calib = [x[i:i + 1] for x in images(5) for i in range(len(x))]
    qp = calibrate(g, calib, "minmax", rollback_small_channels=False)
    assert [q.node for q in qp.ops] == ["c0", "c1"]
    net = FakeQuantNet(g, qp, tmp_path / "net")
    x16 = np.concatenate(images(6)).astype(np.float16)   # a batch of 16
    got = net.cell(ms.Tensor(x16.astype(np.float32))).asnumpy()
    emulator = Emulator(quantized_graph(g, qp))
    want = np.concatenate([emulator.logits(x16[i:i + 1]) for i in range(len(x16))])
    assert got.shape == want.shape == (16, 8, H, H)
    apart = ulps16(got, want)
    assert apart.max() <= 1 and (apart == 0).mean() >= 0.99


def test_the_batch_is_followed_through_transposes_and_dead_channels_train_as_zeros(tmp_path):
    """An attention-like path (a reshape to [1, 2, 8, HW], a transpose that moves the batch to axis 1, a slice of
    the first of the two on axis 0) trains at a batch of 4 and computes per image what the emulator does; an
    output channel of all but zero weights (1e-40, as channel scaling leaves a dead channel) keeps every gradient
    finite; float16 rounding passes a gradient larger than float16 holds."""
    import mindspore as ms
    from test_recovery import H, _conv, images

    from quantflow.ir import Graph, Node, TensorInfo
    from quantflow.quantization.qat import FakeQuantNet, round16

    rng = np.random.default_rng(1)
    w0, w1 = rng.normal(0, 0.3, (16, 8, 3, 3)), rng.normal(0, 0.3, (4, 8, 1, 1))
    b0 = rng.normal(0, 0.1, 16)
    w0[3], b0[3] = 1e-40, 0.0    # dead
    w0[5], b0[5] = 1e-40, 0.5    # not dead: its bias is its output
    hw = H * H
    nodes = [_conv("c0", "x", "y0", w0, b0, pad=1),
             Node("r", "Reshape", ["y0"], ["r0"], {"shape": [1, 2, 8, hw]}),
             Node("t", "Transpose", ["r0"], ["t0"], {"perm": [1, 0, 2, 3]}),
             Node("s", "StridedSlice", ["t0"], ["s0"], {"starts": [0, 0], "ends": [1, 1], "axes": [0, 1],
                                                        "steps": [1, 1], "squeeze": [0]}),
             Node("r2", "Reshape", ["s0"], ["r1"], {"shape": [1, 8, H, H]}),
             _conv("c1", "r1", "out", w1)]
    g = Graph(nodes, ["x"], ["out"], {"c0.w": w0.astype(np.float32), "c0.b": b0.astype(np.float32),
                                      "c1.w": w1.astype(np.float32)},
              {"x": TensorInfo((1, 8, H, H)), "y0": TensorInfo((1, 16, H, H)), "r0": TensorInfo((1, 2, 8, hw)),
               "t0": TensorInfo((2, 1, 8, hw)), "s0": TensorInfo((1, 8, hw)), "r1": TensorInfo((1, 8, H, H)),
               "out": TensorInfo((1, 4, H, H))})
    g.check()
    calib = [x[i:i + 1] for x in images(5) for i in range(len(x))]
    qp = calibrate(g, calib, "minmax", rollback_small_channels=False)
    net = FakeQuantNet(g, qp, tmp_path / "net", learn_ranges=True)
    x = np.concatenate(images(6)).astype(np.float16)
    got = net.cell(ms.Tensor(x.astype(np.float32))).asnumpy()
    emulator = Emulator(quantized_graph(g, qp))
    want = np.concatenate([emulator.logits(x[i:i + 1]) for i in range(len(x))])
    assert got.shape == want.shape == (16, 4, H, H)
    apart = ulps16(got, want)
    assert apart.max() <= 1 and (apart == 0).mean() >= 0.99

    grads = ms.grad(lambda v: net.cell(v).square().mean(), None, net.trainable)(ms.Tensor(x.astype(np.float32)))
    assert all(np.all(np.isfinite(gr.asnumpy())) for gr in grads)
    assert np.all(grads[0].asnumpy()[3] == 0) and grads[1].asnumpy()[3] == 0   # the dead channel is not trained
    assert grads[1].asnumpy()[5] != 0                                          # the bias-only one is
    big = ms.grad(lambda v: (round16(v) * 1e6).sum())(ms.Tensor(np.ones(3, np.float32)))
    np.testing.assert_array_equal(big.asnumpy(), np.full(3, 1e6, np.float32))


def test_the_float_network_after_training_is_fp32s_with_the_learned_channel_scales(tmp_path):
    """FakeQuantNet.float_weights: what a layer rolled back after retraining runs.  Through scale-equivariant pairs
    (ReLU, PReLU) and outside any pair it is the FP32 weights with the learned scales, so the float network computes
    what FP32 does however far training moved the weights; both ends of a ReLU6 pair keep their trained weights."""
    import mindspore as ms
    from dataclasses import replace

    from test_recovery import chain_net, images

    from quantflow.engine.runner import float_runner
    from quantflow.quantization.qat import FakeQuantNet

    g, calib = chain_net(), images(2)
    rng = np.random.default_rng(1)

    def trained(skip):
        qp = calibrate(g, calib, "minmax", skip=skip, rollback_small_channels=False)
        net = FakeQuantNet(g, qp, tmp_path / "-".join(skip), learn_scales=True)
        for u in net.scale_parameters():
            u.set_data(ms.Tensor(rng.normal(0, 0.7, u.shape).astype(np.float32)))
        for f in net.cell.fq:   # as if trained: every weight a few grid steps away
            w = f.weight.asnumpy()
            f.weight.set_data(ms.Tensor((w + rng.normal(0, 3, w.shape)).astype(np.float32)))
        return qp, net

    # c3 -> PReLU -> c4 the only pair (c2 is float): the float network is FP32's, the trained one is not
    qp, net = trained(["c0", "c1", "c2"])
    assert [p.describe() for p in net.pairs] == ["Default/c3 -> PReLU -> Default/c4"]
    x = np.concatenate(images(3))
    ref = float_runner(g).run(x)["out"]
    fw = net.float_weights()
    got = float_runner(replace(qp, float_weights=fw).apply(g)).run(x)["out"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    np.testing.assert_array_equal(fw["c5"]["weight"], g.initializers["c5.w"])
    learned = {n: {k: v[k] for k in ("weight", "bias")} for n, v in net.learned().items()}
    moved = float_runner(replace(qp, float_weights=learned).apply(g)).run(x)["out"]
    assert np.abs(moved - ref).max() > 100 * np.abs(got - ref).max()

    # c1 -> ReLU6 -> c2 rescaled too: both keep their trained weights; c3 and c4 are FP32's, rescaled
    qp, net = trained(["c0"])
    assert "Default/c1 -> ReLU6 -> Default/c2" in [p.describe() for p in net.pairs]
    fw, learned = net.float_weights(), net.learned()
    for n in ("c1", "c2"):
        np.testing.assert_array_equal(fw[n]["weight"], learned[n]["weight"])
        np.testing.assert_array_equal(fw[n]["bias"], learned[n]["bias"])
    s = net.channel_scales()[next(p.tensor for p in net.pairs if p.l2.name == "c4")]
    np.testing.assert_allclose(fw["c4"]["weight"], g.initializers["c4.w"] / s[None, :, None, None], rtol=1e-6)


def hswish_net(seed: int = 0):
    """x -> c0 -> HSwish -> c1 (depthwise) -> HSwish -> c2, in the IR (MobileNetV3's activation between INT8
    convolutions)."""
    from test_recovery import H, N, _conv

    from quantflow.ir import Graph, Node, TensorInfo

    rng = np.random.default_rng(seed)
    w = {"c0": rng.normal(0, 0.5, (16, 8, 3, 3)), "c1": rng.normal(0, 0.4, (16, 1, 3, 3)),
         "c2": rng.normal(0, 0.3, (10, 16, 1, 1))}
    b = {k: rng.normal(0, 0.3, v.shape[0]) for k, v in w.items()}
    nodes = [_conv("c0", "x", "y0", w["c0"], b["c0"], pad=1), Node("a0", "HSwish", ["y0"], ["z0"]),
             _conv("c1", "z0", "y1", w["c1"], b["c1"], group=16, pad=1), Node("a1", "HSwish", ["y1"], ["z1"]),
             _conv("c2", "z1", "out", w["c2"], b["c2"])]
    inits = {f"{k}.{p}": v.astype(np.float32) for p, d in (("w", w), ("b", b)) for k, v in d.items()}
    tensors = {"x": TensorInfo((N, 8, H, H))}
    for n in nodes:
        cout = inits[f"{n.name}.w"].shape[0] if n.op == "Conv2D" else None
        tensors[n.outputs[0]] = TensorInfo((N, cout or tensors[n.inputs[0]].shape[1], H, H))
    g = Graph(nodes, ["x"], ["out"], inits, tensors)
    g.check()
    return g


def test_the_network_starts_as_the_recovered_int8_network_through_hard_swish(tmp_path):
    """MobileNetV3-small (issue: retraining made its INT8 worse at every learning rate): its INT8 weights, rounded by
    the recovery (AdaRound: each weight up or down, a channel's -127 possibly to -126), are not the nearest
    rounding of the graph's float weights, and the emulator rounds hard-swish's gate to float16 before the product.
    The fake-quant network must start as that INT8 network, element for element, and requantize to it."""
    import mindspore as ms
    from dataclasses import replace
    from test_recovery import images

    from quantflow.quantization.qat import FakeQuantNet

    g, calib = hswish_net(), [3 * b for b in images(5)]
    qp = calibrate(g, calib, "minmax", rollback_small_channels=False)
    rng = np.random.default_rng(1)
    ops = []
    for q in qp.ops:   # AdaRound's kind of rounding: a third of the weights the other way, every channel's largest
        w = g.initializers[f"{q.node}.w"].astype(np.float64) / q.scale_w.reshape(-1, *[1] * (q.weight.ndim - 1))
        other = np.clip(np.where(w > q.weight, q.weight + 1, q.weight - 1), -127, 127)
        weight = np.where(rng.uniform(size=w.shape) < 1 / 3, other, q.weight).reshape(len(q.scale_w), -1)
        top = np.abs(weight).argmax(axis=1)   # ... towards zero: the channel's step is no longer max|w| / 127
        weight[np.arange(len(top)), top] -= np.sign(weight[np.arange(len(top)), top])
        ops.append(replace(q, weight=weight.reshape(q.weight.shape).astype(np.int8)))
    qp = replace(qp, ops=ops)
    net = FakeQuantNet(g, qp, tmp_path / "net")
    x = np.concatenate(images(6)).astype(np.float16) * np.float16(3)
    got = net.cell(ms.Tensor(x.astype(np.float32))).asnumpy()
    np.testing.assert_array_equal(got, Emulator(quantized_graph(g, qp)).logits(x))   # before: 99% of them apart
    for a, b in zip(net.requantized().ops, qp.ops):
        np.testing.assert_array_equal(a.weight, b.weight)
        np.testing.assert_array_equal(a.bias, b.bias)
        np.testing.assert_array_equal(a.deq_scale, b.deq_scale)
