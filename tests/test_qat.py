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
