"""The integer emulator against an independent integer reference, and quantization arithmetic."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from quantflow import emulator
from quantflow.calibrate import Calibrater, calibrate, load_quant_params, write_quant_params
from quantflow.errors import UnsupportedNetworkError
from quantflow.graph import read_plan, same_pads, verify_plan
from quantflow.quantize import (QLayer, QStep, act_qparams, build_blocks, quantize_multiplier, quantize_tensor,
                                requantize, weight_qparams)

ms.set_context(mode=ms.PYNATIVE_MODE)


class SmallNet(nn.Cell):
    """Exercises stride/same/valid/pad padding, groups, BN folding, ReLU6, both pools, Dense+activation."""

    def __init__(self):
        super().__init__()
        self.body = nn.SequentialCell([
            nn.Conv2d(3, 8, 3, stride=2, pad_mode="same", has_bias=True),
            nn.BatchNorm2d(8),
            nn.ReLU6(),
            nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="same"),
            nn.Conv2d(8, 8, 3, pad_mode="pad", padding=1, group=2, has_bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AvgPool2d(kernel_size=2, stride=2),
            nn.Conv2d(8, 6, 1, pad_mode="valid", has_bias=True),
        ])
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(6 * 2 * 2, 12, activation="relu")
        self.drop = nn.Dropout(p=0.5)
        self.fc2 = nn.Dense(12, 5)

    def construct(self, x):
        return self.fc2(self.drop(self.fc1(self.flatten(self.body(x)))))


def small_net(seed=0) -> SmallNet:
    rng = np.random.default_rng(seed)
    net = SmallNet()
    for p in net.get_parameters():
        shape = p.shape
        if "moving_variance" in p.name:
            v = rng.uniform(0.5, 2.0, shape)
        elif "gamma" in p.name:
            v = rng.uniform(0.5, 1.5, shape)
        else:
            v = rng.normal(0.0, 0.4, shape)
        p.set_data(Tensor(v.astype(np.float32)))
    net.set_train(False)
    return net


@pytest.fixture(scope="module")
def net_and_data():
    rng = np.random.default_rng(1)
    net = small_net()
    x = rng.normal(0.0, 1.0, (48, 3, 16, 16)).astype(np.float32)
    return net, x


# ----------------------------------------------------------------------------- independent reference

def ref_conv(xq, zp, layer):
    """Zero-centred int64 convolution by kernel offsets (no im2col, no float)."""
    c = layer.conv
    x = xq.astype(np.int64) - zp
    o, cg, kh, kw = layer.w_q.shape
    sh, sw = c["stride"]
    dh, dw = c["dilation"]
    n, ch, h, w = x.shape
    if c["pad_mode"] == "same":
        t, b = same_pads(h, kh, sh, dh)
        l, r = same_pads(w, kw, sw, dw)
    elif c["pad_mode"] == "pad":
        t, b, l, r = c["padding"]
    else:
        t = b = l = r = 0
    x = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))
    oh = (x.shape[2] - (kh - 1) * dh - 1) // sh + 1
    ow = (x.shape[3] - (kw - 1) * dw - 1) // sw + 1
    g = c["group"]
    og = o // g
    out = np.zeros((n, o, oh, ow), np.int64)
    wq = layer.w_q.astype(np.int64)
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
            for gi in range(g):
                out[:, gi * og:(gi + 1) * og] += np.einsum(
                    "nchw,oc->nohw", patch[:, gi * cg:(gi + 1) * cg], wq[gi * og:(gi + 1) * og, :, i, j])
    return out + layer.b_q.astype(np.int64).reshape(1, -1, 1, 1)


def ref_requant(acc, layer):
    """Python big-int requantization: floor(acc * m0 / 2**shift + 1/2)."""
    out = np.empty(acc.shape, np.int64)
    for ch in range(acc.shape[1]):
        m0, s = int(layer.m0[ch]), int(layer.shift[ch])
        vals = acc[:, ch].ravel().tolist()
        out[:, ch] = np.array([(v * m0 + (1 << (s - 1))) >> s for v in vals]).reshape(out[:, ch].shape)
    return np.clip(out + layer.out_zp, layer.clamp_lo, layer.clamp_hi)


def ref_run(model, x):
    q = np.clip(np.floor(x.astype(np.float64) / model.input_scale + 0.5) + model.input_zp, -128, 127).astype(np.int64)
    zp, scale, trace = model.input_zp, model.input_scale, {}
    for step in model.steps:
        if isinstance(step, QLayer):
            if step.kind == "conv":
                acc = ref_conv(q, zp, step)
            else:
                acc = np.einsum("nk,ok->no", q.astype(np.int64) - zp, step.w_q.astype(np.int64)) + step.b_q
            assert np.abs(acc).max() < 2**31
            if step.final:
                return acc * (step.in_scale * step.w_scale), trace
            q = ref_requant(acc, step)
            zp, scale = step.out_zp, step.out_scale
            trace[step.name] = q
        elif step.kind == "pool":
            k, s = step.attrs["kernel"], step.attrs["stride"]
            n, c, h, w = q.shape
            if step.attrs["pad_mode"] == "same":
                t, b = same_pads(h, k[0], s[0])
                l, r = same_pads(w, k[1], s[1])
            else:
                t = b = l = r = 0
            padv = -128 if step.attrs["mode"] == "max" else zp
            qp = np.pad(q, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=padv)
            oh, ow = (qp.shape[2] - k[0]) // s[0] + 1, (qp.shape[3] - k[1]) // s[1] + 1
            out = np.empty((n, c, oh, ow), np.int64)
            for i in range(oh):
                for j in range(ow):
                    win = qp[:, :, i * s[0]: i * s[0] + k[0], j * s[1]: j * s[1] + k[1]].reshape(n, c, -1)
                    if step.attrs["mode"] == "max":
                        out[:, :, i, j] = win.max(-1)
                    else:
                        tot, cnt = win.sum(-1), win.shape[-1]
                        out[:, :, i, j] = np.floor_divide(2 * tot + cnt, 2 * cnt)
            q = out
        elif step.kind == "flatten":
            q = q.reshape(len(q), -1)
        elif step.kind == "relu":
            q = np.maximum(q, zp)
    raise AssertionError("no final layer")


# ----------------------------------------------------------------------------- tests

@pytest.mark.parametrize("method", ["minmax", "percentile", "kl"])
def test_emulator_is_bit_exact_against_the_reference(net_and_data, method):
    net, x = net_and_data
    model = calibrate(net, x[:32], (1, 3, 16, 16), method, percentile=99.9, bins=1024, batch_size=16)
    got, trace = emulator.run(model, x[32:], return_int8=True)
    ref, ref_trace = ref_run(model, x[32:])
    assert set(trace) == set(ref_trace) and len(trace) == 4  # every requantized layer compared
    for name in trace:
        assert trace[name].dtype == np.int8
        np.testing.assert_array_equal(trace[name].astype(np.int64), ref_trace[name], err_msg=name)
    np.testing.assert_array_equal(got, ref)


def test_int8_output_tracks_fp32(net_and_data):
    net, x = net_and_data
    model = calibrate(net, x[:32], (1, 3, 16, 16), "minmax", bins=1024)
    fp = net(Tensor(x[32:])).asnumpy()
    q = emulator.run(model, x[32:])
    rel = np.abs(q - fp).mean() / np.abs(fp).mean()
    assert rel < 0.08, rel
    assert np.corrcoef(q.ravel(), fp.ravel())[0, 1] > 0.99


def test_quant_params_round_trip(tmp_path, net_and_data):
    net, x = net_and_data
    model = calibrate(net, x[:16], (1, 3, 16, 16), "percentile", percentile=99.0, bins=512)
    write_quant_params(model, tmp_path)
    again = load_quant_params(tmp_path)
    np.testing.assert_array_equal(emulator.run(model, x[16:]), emulator.run(again, x[16:]))
    layers = [s for s in again.steps if isinstance(s, QLayer)]
    assert [l.w_q.dtype for l in layers] == [np.int8] * 5
    assert [l.b_q.dtype for l in layers] == [np.int32] * 5
    assert sum(l.final for l in layers) == 1 and layers[-1].final
    assert any(isinstance(s, QStep) and s.kind == "pool" for s in again.steps)


def test_observers_sit_around_every_conv_and_dense(net_and_data):
    net, x = net_and_data
    items = build_blocks(read_plan(net))
    cal = Calibrater(net, items, bins=64)
    with cal:
        cal.collect([x[:8]])
    layers = ["body.0", "body.4", "body.8", "fc1", "fc2"]
    for name in layers:
        assert cal.observers[f"{name}:in"].count > 0 and cal.observers[f"{name}:out"].count > 0
    # fused outputs: BN-less ReLU6 after folded BN, and the Dense's own activation
    assert cal.observers["body.2"].lo >= 0.0 and cal.observers["body.2"].hi <= 6.0
    assert cal.observers["fc1.activation"].lo >= 0.0
    # hooks are removed afterwards
    before = cal.observers["fc2:in"].count
    net(Tensor(x[:4]))
    assert cal.observers["fc2:in"].count == before


def test_requantize_matches_exact_rational_rounding():
    rng = np.random.default_rng(5)
    m = rng.uniform(1e-5, 0.9, 64)
    m0, shift = quantize_multiplier(m)
    assert np.all((m0 >= 2**30) & (m0 < 2**31))
    assert np.allclose(m0 / 2.0 ** shift, m, rtol=1e-9)
    acc = rng.integers(-2**31 + 1, 2**31 - 1, (7, 64))
    got = requantize(acc, m0, shift)
    for i in range(7):
        for c in range(64):
            a, mm, s = int(acc[i, c]), int(m0[c]), int(shift[c])
            assert got[i, c] == (a * mm + (1 << (s - 1))) >> s


def test_activation_and_weight_quantization():
    scale, zp = act_qparams(0.0, 5.1)
    assert zp == -128 and scale == pytest.approx(0.02)
    scale, zp = act_qparams(-1.0, 1.0)
    assert zp == 0
    q = quantize_tensor(np.array([-10.0, -1.0, 0.0, 0.4999 * scale, 1.0, 10.0]), scale, zp)
    assert q.tolist() == [-128, -127, 0, 0, 127, 127]
    w = np.array([[[[0.5, -1.0]]], [[[0.0, 0.0]]]])
    wq, ws = weight_qparams(w)
    assert wq.tolist() == [[[[64, -127]]], [[[0, 0]]]] and ws[0] == pytest.approx(1 / 127) and ws[1] == 1.0


def test_accumulator_overflow_is_reported():
    layer = QLayer("big", "dense", np.full((1, 4), 127, np.int8), np.ones(1), np.array([2**31 - 10], np.int32),
                   1.0, 0, final=True)
    from quantflow.quantize import QuantModel
    model = QuantModel((1, 4), 1.0, 0, [layer], "minmax", {})
    with pytest.raises(emulator.AccumulatorOverflow, match="int32 accumulator overflow"):
        emulator.run(model, np.full((1, 4), 127.0))


class Residual(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.conv(x)) + x


class Twice(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3)

    def construct(self, x):
        return self.conv(self.conv(x))


class WithSigmoid(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3)
        self.act = nn.Sigmoid()

    def construct(self, x):
        return self.act(self.conv(x))


@pytest.mark.parametrize("cls,message", [
    (Residual, "not a plain sequence"),
    (Twice, "not a plain sequence"),
    (WithSigmoid, "Sigmoid"),
])
def test_unsupported_networks_are_refused_clearly(cls, message):
    net = cls()
    net.set_train(False)
    x = np.random.default_rng(0).normal(size=(2, 3, 8, 8)).astype(np.float32)
    with pytest.raises(UnsupportedNetworkError, match=message):
        calibrate(net, x, (1, 3, 8, 8), "minmax", bins=256)


def test_plan_reproduces_mindspore(net_and_data):
    net, x = net_and_data
    assert verify_plan(read_plan(net), net, x[:8]) < 1e-3


def test_grayscale_images_from_disk(tmp_path):
    import cv2
    from quantflow.images import ImageBatches

    rng = np.random.default_rng(9)
    paths = []
    for i in range(20):
        p = tmp_path / f"{i}.png"
        cv2.imwrite(str(p), rng.integers(0, 256, (12, 12), dtype=np.uint8))
        paths.append(p)
    batches = ImageBatches(paths, 1, 12, 12, (0.5,), (0.25,), "0-1", "GRAY", batch_size=8)
    assert [b.shape for b in batches] == [(8, 1, 12, 12), (8, 1, 12, 12), (4, 1, 12, 12)]
    net = nn.SequentialCell([nn.Conv2d(1, 4, 3, has_bias=True), nn.ReLU(), nn.Flatten(), nn.Dense(4 * 12 * 12, 3)])
    net.set_train(False)
    model = calibrate(net, batches, (1, 1, 12, 12), "kl", bins=512)
    x = next(iter(batches))
    got = emulator.run(model, x)
    ref, _ = ref_run(model, x)
    np.testing.assert_array_equal(got, ref)
    fp = net(Tensor(x)).asnumpy()
    assert np.abs(got - fp).max() < 0.1 * np.abs(fp).max()
