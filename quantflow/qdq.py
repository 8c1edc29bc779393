"""The INT8-simulating MindSpore network: the calibrated model as quantize-dequantize float graph.

Every weight is replaced by its int8-grid value (BN folded, ``w_q * s_w``), every bias by its
int32-grid value, and every tensor the integer emulator holds in int8 passes through
``FakeQuant`` (``(clip(floor(x / s + 0.5) + zp, lo, hi) - zp) * s``).  Run in float, it
reproduces the integer emulator up to float rounding at the rounding boundaries, so an
offline model built from it (with a precision mode that keeps float32) computes what the
accuracy gate measured.  It is exported as ``model_int8sim.mindir`` (and AIR on Ascend hosts).
"""
from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from .quantize import QMAX, QMIN, QLayer, QStep, QuantModel


class FakeQuant(nn.Cell):
    """Quantize-dequantize: ``(clip(floor(x / s + 0.5) + zp, lo, hi) - zp) * s``."""

    def __init__(self, scale: float, zp: int, lo: int = QMIN, hi: int = QMAX, snap: int = 0):
        super().__init__()
        self.scale = float(scale)
        self.zp = float(zp)
        self.lo = float(lo)
        self.hi = float(hi)
        self.snap = float(snap)

    def construct(self, x):
        v = x / self.scale
        if self.snap > 0:
            # values known to be exact multiples of 1/snap (an average of n int8 values): remove
            # the float noise that would otherwise decide ties differently from the integer emulator
            v = ops.round(v * self.snap) / self.snap
        q = ops.floor(v + 0.5) + self.zp
        q = ops.clamp(q, self.lo, self.hi)
        return (q - self.zp) * self.scale


class Int8SimNet(nn.Cell):
    """The simulating layers, behind a graph input named ``x`` (model.input_name's default)."""

    def __init__(self, body):
        super().__init__()
        self.body = body

    def construct(self, x):
        return self.body(x)


def _layer_cell(layer: QLayer):
    shape = (-1,) + (1,) * (layer.w_q.ndim - 1)
    w = (layer.w_q.astype(np.float64) * layer.w_scale.reshape(shape)).astype(np.float32)
    b = (layer.b_q.astype(np.float64) * layer.in_scale * layer.w_scale).astype(np.float32)
    if layer.kind == "conv":
        c = layer.conv
        o, cg, kh, kw = w.shape
        kwargs = {}
        if c["pad_mode"] == "pad":
            kwargs["padding"] = tuple(int(p) for p in c["padding"])
        cell = nn.Conv2d(cg * c["group"], o, (kh, kw), stride=tuple(c["stride"]), pad_mode=c["pad_mode"],
                         dilation=tuple(c["dilation"]), group=c["group"], has_bias=True, **kwargs)
    else:
        cell = nn.Dense(w.shape[1], w.shape[0], has_bias=True)
    cell.weight = Parameter(Tensor(w), name=f"{layer.name}.weight")
    cell.bias = Parameter(Tensor(b), name=f"{layer.name}.bias")
    return cell


def _pool_cell(step: QStep):
    a = step.attrs
    cls = nn.MaxPool2d if a["mode"] == "max" else nn.AvgPool2d
    kernel, stride = tuple(a["kernel"]), tuple(a["stride"])
    if a["pad_mode"] == "pad":
        t, _, l, _ = a["padding"]
        return cls(kernel_size=kernel, stride=stride, pad_mode="pad", padding=(int(t), int(l)))
    return cls(kernel_size=kernel, stride=stride, pad_mode=a["pad_mode"])


def _relu_cell(cap):
    if cap is None:
        return nn.ReLU()
    if cap == 6.0:
        return nn.ReLU6()
    raise ValueError(f"no ReLU with cap {cap}")  # read_plan only makes ReLU and ReLU6


def build_qdq_network(model: QuantModel):
    """A mindspore.nn.SequentialCell computing the INT8 model in float."""
    cells = [FakeQuant(model.input_scale, model.input_zp)]
    scale, zp = model.input_scale, model.input_zp
    dequantized = False
    for step in model.steps:
        if isinstance(step, QLayer):
            cells.append(_layer_cell(step))
            if step.final:
                dequantized = True
                if step.relu:
                    cells.append(_relu_cell(step.relu_cap))
            else:
                cells.append(FakeQuant(step.out_scale, step.out_zp, step.clamp_lo, step.clamp_hi))
                scale, zp = step.out_scale, step.out_zp
        elif step.kind == "pool":
            cells.append(_pool_cell(step))
            if step.attrs["mode"] == "avg" and not dequantized:
                n = int(np.prod(step.attrs["kernel"]))
                cells.append(FakeQuant(scale, zp, snap=n))  # the emulator rounds the average back to int8
        elif step.kind == "flatten":
            cells.append(nn.Flatten())
        elif step.kind == "relu":
            cap = step.attrs.get("cap")
            if dequantized:
                cells.append(_relu_cell(cap))
            else:
                hi = QMAX if cap is None else int(min(QMAX, zp + np.floor(cap / scale + 0.5)))
                cells.append(FakeQuant(scale, zp, max(QMIN, zp), hi))
    net = Int8SimNet(nn.SequentialCell(cells))
    net.set_train(False)
    return net

