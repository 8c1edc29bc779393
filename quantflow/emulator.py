"""Bit-accurate integer emulation of a QuantModel on the CPU (NumPy only, no MindSpore).

Every tensor between the input quantization and the last layer is int8; each Conv2d/Dense
multiplies int8 x int8 and accumulates in int32 (checked for overflow), adds the int32
bias, and requantizes with the integer multiplier/shift.  The int8 x int8 products are
summed through float64 matrix products: every partial sum is an integer below 2**53, so
the result is exactly the integer sum (asserted), while using BLAS for speed.
"""
from __future__ import annotations

import numpy as np

from .errors import QuantflowError
from .graph import ConvOp, PoolOp, conv_matmul, pool_windows
from .quantize import QMAX, QMIN, QLayer, QStep, QuantModel, quantize_tensor, requantize

INT32_MAX = 2**31 - 1
EXACT = 2**53


class AccumulatorOverflow(QuantflowError):
    pass


def _conv_op(layer: QLayer) -> ConvOp:
    c = layer.conv
    return ConvOp(layer.name, "conv", layer.w_q, None, tuple(c["stride"]), tuple(c["dilation"]), c["pad_mode"],
                  tuple(c["padding"]), int(c["group"]))


def _pool_op(step: QStep) -> PoolOp:
    a = step.attrs
    return PoolOp(step.name, "pool", a["mode"], tuple(a["kernel"]), tuple(a["stride"]), a["pad_mode"], tuple(a["padding"]))


def _accumulate(layer: QLayer, xq: np.ndarray) -> np.ndarray:
    """int32 accumulator of one layer: sum(w_q * (x_q - zp_in)) + b_q."""
    x = xq.astype(np.float64) - layer.in_zp        # zero-centred int8 values, padding 0 == real 0
    w = layer.w_q.astype(np.float64)
    k = int(np.prod(w.shape[1:]))
    if k * 255 * 127 >= EXACT:  # pragma: no cover - would need a 2**37-element reduction
        raise AccumulatorOverflow(f"{layer.name}: reduction too long for exact emulation")
    if layer.kind == "conv":
        acc = conv_matmul(x, w, _conv_op(layer))
        bias = layer.b_q.astype(np.int64).reshape(1, -1, 1, 1)
    else:
        if x.ndim != 2:
            raise QuantflowError(f"{layer.name}: Dense got a {x.ndim}-d input")
        acc = x @ w.T
        bias = layer.b_q.astype(np.int64).reshape(1, -1)
    acc = np.rint(acc).astype(np.int64) + bias
    if np.abs(acc).max(initial=0) > INT32_MAX:
        raise AccumulatorOverflow(f"{layer.name}: int32 accumulator overflow (|acc| = {np.abs(acc).max()})")
    return acc


def _float_step(step: QStep, y: np.ndarray) -> np.ndarray:
    if step.kind == "pool":
        op = _pool_op(step)
        win, _ = pool_windows(y, op, -np.inf if op.mode == "max" else 0.0)
        return win.max(axis=-1) if op.mode == "max" else win.mean(axis=-1)
    if step.kind == "relu":
        cap = step.attrs.get("cap")
        return np.maximum(y, 0.0) if cap is None else np.clip(y, 0.0, cap)
    if step.kind == "flatten":
        return y.reshape(len(y), -1)
    return y


def _int_step(step: QStep, q: np.ndarray, scale: float, zp: int) -> np.ndarray:
    if step.kind == "pool":
        op = _pool_op(step)
        if op.mode == "max":
            win, _ = pool_windows(q, op, QMIN)
            return win.max(axis=-1)
        win, _ = pool_windows(q.astype(np.int64), op, zp)
        n = win.shape[-1]
        s = win.sum(axis=-1)
        return np.clip((2 * s + n) // (2 * n), QMIN, QMAX).astype(np.int8)  # round half up
    if step.kind == "relu":
        cap = step.attrs.get("cap")
        hi = QMAX if cap is None else int(min(QMAX, zp + np.floor(cap / scale + 0.5)))
        return np.clip(q, max(QMIN, zp), hi).astype(np.int8)
    if step.kind == "flatten":
        return q.reshape(len(q), -1)
    return q


def run(model: QuantModel, x: np.ndarray, return_int8: bool = False):
    """Emulate the INT8 network on preprocessed float input ``x`` (N,C,H,W); returns float logits.

    With ``return_int8``, also returns {layer name: int8 output} for inspection.
    """
    q = quantize_tensor(x, model.input_scale, model.input_zp)
    scale, zp = model.input_scale, model.input_zp
    y = None  # float tensor once the last layer has dequantized
    trace = {}
    for step in model.steps:
        if y is not None:
            if isinstance(step, QLayer):  # pragma: no cover - make_quant_model marks only the last layer final
                raise QuantflowError(f"{step.name}: quantized layer after the final layer")
            y = _float_step(step, y)
            continue
        if isinstance(step, QLayer):
            if abs(step.in_scale - scale) > 1e-12 * max(scale, 1.0) or step.in_zp != zp:
                raise QuantflowError(f"{step.name}: input quantization does not match the tensor feeding it")
            acc = _accumulate(step, q)
            if step.final:
                shape = (1, -1) + (1,) * (acc.ndim - 2)
                y = acc.astype(np.float64) * (step.in_scale * step.w_scale).reshape(shape)
                if step.relu:
                    y = np.maximum(y, 0.0) if step.relu_cap is None else np.clip(y, 0.0, step.relu_cap)
            else:
                out = requantize(acc, step.m0, step.shift) + step.out_zp
                q = np.clip(out, step.clamp_lo, step.clamp_hi).astype(np.int8)
                scale, zp = step.out_scale, step.out_zp
                if return_int8:
                    trace[step.name] = q
        else:
            q = _int_step(step, q, scale, zp)
    if y is None:  # pragma: no cover - there is always a final layer
        y = (q.astype(np.float64) - zp) * scale
    return (y, trace) if return_int8 else y


def predict(model: QuantModel, x: np.ndarray, batch_size: int = 128) -> np.ndarray:
    return np.concatenate([run(model, x[i:i + batch_size]) for i in range(0, len(x), batch_size)]) \
        if len(x) else np.zeros((0,), np.float64)
