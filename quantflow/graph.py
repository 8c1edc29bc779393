"""Reading the user's MindSpore network into a plan of layers, and running that plan in NumPy.

The quantizer and the integer emulator work on a *plan*: the network's layers in execution
order, with their weights copied out.  The plan is read from the cell tree (layers in the
order they are registered), and then **verified**: the NumPy float run of the plan must
reproduce MindSpore's own output on real inputs, otherwise the network is reported as
unsupported (e.g. a residual connection or a layer called twice) instead of being quantized
wrongly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .errors import UnsupportedNetworkError

SUPPORTED = "Conv2d, Dense, BatchNorm2d (after a Conv2d), ReLU, ReLU6, MaxPool2d, AvgPool2d, Flatten, Dropout"


@dataclass
class Op:
    name: str
    kind: str


@dataclass
class ConvOp(Op):
    weight: np.ndarray          # O, I/group, kh, kw
    bias: Optional[np.ndarray]  # O
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pad_mode: str               # "pad" | "same" | "valid"
    padding: tuple[int, int, int, int]  # top, bottom, left, right (pad_mode "pad")
    group: int


@dataclass
class DenseOp(Op):
    weight: np.ndarray          # O, I
    bias: Optional[np.ndarray]


@dataclass
class BatchNormOp(Op):
    scale: np.ndarray           # gamma / sqrt(var + eps)
    shift: np.ndarray           # beta - mean * scale


@dataclass
class ReluOp(Op):
    cap: Optional[float] = None  # 6.0 for ReLU6


@dataclass
class PoolOp(Op):
    mode: str                    # "max" | "avg"
    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad_mode: str                # "valid" | "same" | "pad"
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)


@dataclass
class FlattenOp(Op):
    pass


@dataclass
class IdentityOp(Op):
    pass


@dataclass
class Plan:
    ops: list[Op] = field(default_factory=list)

    def names(self) -> list[str]:
        return [op.name for op in self.ops]


def _pair(v) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    v = tuple(int(a) for a in v)
    return v[-2:] if len(v) >= 2 else (v[0], v[0])


def _np(param) -> np.ndarray:
    return param.asnumpy().astype(np.float64)


def _conv_padding(cell) -> tuple[int, int, int, int]:
    p = cell.padding
    if isinstance(p, int):
        return (p, p, p, p)
    p = tuple(int(a) for a in p)
    if len(p) == 4:
        return p
    if len(p) == 2:
        return (p[0], p[0], p[1], p[1])
    raise UnsupportedNetworkError(f"{cell.cls_name}: padding {p!r} not understood")


def read_plan(net) -> Plan:
    """The network's layers, in registration order, as a Plan (raises for unsupported layers)."""
    from mindspore import nn

    leaf_types = (nn.Conv2d, nn.Dense, nn.BatchNorm2d, nn.ReLU, nn.ReLU6, nn.MaxPool2d, nn.AvgPool2d,
                  nn.Flatten, nn.Dropout)
    plan = Plan()
    skip_prefixes: list[str] = []
    for name, cell in net.cells_and_names():
        if any(name.startswith(p) for p in skip_prefixes):
            continue
        if not isinstance(cell, leaf_types):
            if cell.name_cells():
                continue  # a container: its children follow
            raise UnsupportedNetworkError(
                f"layer {name!r} ({type(cell).__name__}) is not supported by the quantizer; supported: {SUPPORTED}")
        skip_prefixes.append(name + ".")
        label = name or type(cell).__name__
        if isinstance(cell, nn.Conv2d):
            if cell.data_format != "NCHW":
                raise UnsupportedNetworkError(f"{label}: only NCHW convolutions are supported")
            plan.ops.append(ConvOp(
                label, "conv", _np(cell.weight), _np(cell.bias) if cell.has_bias else None,
                _pair(cell.stride), _pair(cell.dilation), cell.pad_mode.lower(),
                _conv_padding(cell) if cell.pad_mode.lower() == "pad" else (0, 0, 0, 0), int(cell.group)))
        elif isinstance(cell, nn.Dense):
            plan.ops.append(DenseOp(label, "dense", _np(cell.weight), _np(cell.bias) if cell.has_bias else None))
            if getattr(cell, "activation_flag", False):
                act = cell.activation
                if isinstance(act, nn.ReLU6):
                    plan.ops.append(ReluOp(label + ".activation", "relu", 6.0))
                elif isinstance(act, nn.ReLU):
                    plan.ops.append(ReluOp(label + ".activation", "relu"))
                else:
                    raise UnsupportedNetworkError(
                        f"{label}: Dense activation {type(act).__name__} is not supported (ReLU, ReLU6 are)")
        elif isinstance(cell, nn.BatchNorm2d):
            gamma, beta = _np(cell.gamma), _np(cell.beta)
            mean, var = _np(cell.moving_mean), _np(cell.moving_variance)
            scale = gamma / np.sqrt(var + float(cell.eps))
            plan.ops.append(BatchNormOp(label, "bn", scale, beta - mean * scale))
        elif isinstance(cell, nn.ReLU6):
            plan.ops.append(ReluOp(label, "relu", 6.0))
        elif isinstance(cell, nn.ReLU):
            plan.ops.append(ReluOp(label, "relu"))
        elif isinstance(cell, (nn.MaxPool2d, nn.AvgPool2d)):
            mode = "max" if isinstance(cell, nn.MaxPool2d) else "avg"
            pad_mode = str(cell.pad_mode).lower()
            padding = (0, 0, 0, 0)
            if getattr(cell, "use_pad", False):
                if mode == "avg":
                    raise UnsupportedNetworkError(f"{label}: AvgPool2d with explicit padding is not supported")
                ph, pw = _pair(cell.padding)
                padding = (ph, ph, pw, pw)
                pad_mode = "pad"
                if getattr(cell.max_pool, "ceil_mode", False):
                    raise UnsupportedNetworkError(f"{label}: ceil_mode pooling is not supported")
            if pad_mode not in ("valid", "same", "pad"):
                raise UnsupportedNetworkError(f"{label}: pooling pad_mode {cell.pad_mode!r} not supported")
            if str(getattr(cell, "format", "NCHW")) != "NCHW":
                raise UnsupportedNetworkError(f"{label}: only NCHW pooling is supported")
            plan.ops.append(PoolOp(label, "pool", mode, _pair(cell.kernel_size), _pair(cell.stride), pad_mode, padding))
        elif isinstance(cell, nn.Flatten):
            if getattr(cell, "start_dim", 1) != 1 or getattr(cell, "end_dim", -1) != -1:
                raise UnsupportedNetworkError(f"{label}: only Flatten(start_dim=1, end_dim=-1) is supported")
            plan.ops.append(FlattenOp(label, "flatten"))
        elif isinstance(cell, nn.Dropout):
            plan.ops.append(IdentityOp(label, "identity"))
    if not any(isinstance(op, (ConvOp, DenseOp)) for op in plan.ops):
        raise UnsupportedNetworkError("the network holds no Conv2d or Dense layer to quantize")
    return plan


# ----------------------------------------------------------------------------- NumPy kernels

def same_pads(size: int, k: int, s: int, d: int = 1) -> tuple[int, int]:
    out = -(-size // s)
    need = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
    return need // 2, need - need // 2


def conv_pads(op: ConvOp, h: int, w: int) -> tuple[int, int, int, int]:
    kh, kw = op.weight.shape[2:]
    if op.pad_mode == "same":
        return same_pads(h, kh, op.stride[0], op.dilation[0]) + same_pads(w, kw, op.stride[1], op.dilation[1])
    if op.pad_mode == "valid":
        return (0, 0, 0, 0)
    return op.padding


def im2col(x: np.ndarray, kh: int, kw: int, stride, dilation, pads, pad_value=0) -> tuple[np.ndarray, int, int]:
    """x: N,C,H,W -> (N*OH*OW, C*kh*kw) patches (C-major, then kh, kw), OH, OW."""
    t, b, l, r = pads
    if any(pads):
        x = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=pad_value)
    n, c, h, w = x.shape
    sh, sw = stride
    dh, dw = dilation
    oh = (h - (kh - 1) * dh - 1) // sh + 1
    ow = (w - (kw - 1) * dw - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        raise UnsupportedNetworkError(f"kernel {kh}x{kw} does not fit a {h}x{w} input")
    cols = np.empty((n, c, kh, kw, oh, ow), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = x[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
    return cols.transpose(0, 4, 5, 1, 2, 3).reshape(n * oh * ow, c * kh * kw), oh, ow


def conv_matmul(x: np.ndarray, weight: np.ndarray, op: ConvOp, pad_value=0) -> np.ndarray:
    """Grouped convolution as matrix products; x and weight of the same dtype. Returns N,O,OH,OW."""
    n, c, h, w = x.shape
    o, cg, kh, kw = weight.shape
    g = op.group
    if c != cg * g:
        raise UnsupportedNetworkError(f"{op.name}: input has {c} channels, weights expect {cg * g}")
    pads = conv_pads(op, h, w)
    outs = []
    og = o // g
    for gi in range(g):
        cols, oh, ow = im2col(x[:, gi * cg:(gi + 1) * cg], kh, kw, op.stride, op.dilation, pads, pad_value)
        wm = weight[gi * og:(gi + 1) * og].reshape(og, -1)
        outs.append((cols @ wm.T).reshape(n, oh, ow, og))
    return np.concatenate(outs, axis=3).transpose(0, 3, 1, 2)


def pool_pads(op: PoolOp, h: int, w: int) -> tuple[int, int, int, int]:
    if op.pad_mode == "same":
        return same_pads(h, op.kernel[0], op.stride[0]) + same_pads(w, op.kernel[1], op.stride[1])
    return op.padding


def pool_windows(x: np.ndarray, op: PoolOp, pad_value) -> np.ndarray:
    """N,C,H,W -> N,C,OH,OW,kh*kw windows."""
    n, c, h, w = x.shape
    kh, kw = op.kernel
    pads = pool_pads(op, h, w)
    cols, oh, ow = im2col(x.reshape(n * c, 1, h, w), kh, kw, op.stride, (1, 1), pads, pad_value)
    return cols.reshape(n, c, oh, ow, kh * kw), pads


def run_float(plan: Plan, x: np.ndarray) -> np.ndarray:
    """Run the plan in float64 (the reference the MindSpore output is checked against)."""
    y = np.asarray(x, np.float64)
    for op in plan.ops:
        if isinstance(op, ConvOp):
            y = conv_matmul(y, op.weight, op)
            if op.bias is not None:
                y = y + op.bias[None, :, None, None]
        elif isinstance(op, DenseOp):
            if y.ndim != 2:
                raise UnsupportedNetworkError(f"{op.name}: Dense got a {y.ndim}-d input; add an nn.Flatten before it")
            y = y @ op.weight.T + (op.bias if op.bias is not None else 0.0)
        elif isinstance(op, BatchNormOp):
            y = y * op.scale[None, :, None, None] + op.shift[None, :, None, None]
        elif isinstance(op, ReluOp):
            y = np.maximum(y, 0.0) if op.cap is None else np.clip(y, 0.0, op.cap)
        elif isinstance(op, PoolOp):
            if op.mode == "max":
                win, _ = pool_windows(y, op, -np.inf)
                y = win.max(axis=-1)
            else:
                win, _ = pool_windows(y, op, 0.0)
                y = win.mean(axis=-1)
        elif isinstance(op, FlattenOp):
            y = y.reshape(len(y), -1)
    return y


def verify_plan(plan: Plan, net, x: np.ndarray, rtol: float = 1e-3) -> float:
    """Check that the NumPy plan reproduces MindSpore on ``x``; returns the largest difference."""
    from mindspore import Tensor

    ref = net(Tensor(np.asarray(x, np.float32))).asnumpy().astype(np.float64)
    try:
        got = run_float(plan, x)
    except (ValueError, UnsupportedNetworkError) as err:
        raise UnsupportedNetworkError(
            f"the network's layers, taken in order ({' -> '.join(plan.names())}), cannot be run as a sequence: {err}. "
            f"quantflow supports plain feed-forward networks of: {SUPPORTED}") from None
    if got.shape != ref.shape:
        raise UnsupportedNetworkError(
            f"the network's layers, taken in order, give an output of shape {got.shape} but the network gives "
            f"{ref.shape}: its construct() is not a plain sequence of its layers")
    diff = float(np.max(np.abs(got - ref)))
    if diff > rtol * (1.0 + float(np.max(np.abs(ref)))):
        raise UnsupportedNetworkError(
            f"the network's layers, taken in order ({' -> '.join(plan.names())}), do not reproduce its output "
            f"(largest difference {diff:.4g}): its construct() is not a plain sequence of its layers (residual "
            f"connections, functional ops or layers used twice are not supported by the integer emulator)")
    return diff
