"""The Ascend INT8 scheme: how quantflow chooses the parameters of a quantized Conv2D / MatMul.

What the device computes with them (AscendQuant -> int8 cube op -> AscendDequant) is written
once, in the registry's Quant / Conv2D / MatMul / Dequant entries (``quantflow.ops.quant``); the
README lists the roundings modelled.

- Input activation: per-tensor asymmetric int8, ``scale_d`` and integer ``offset_d`` so that
  [lo, hi] (widened to hold 0) maps onto [-128, 127]: ``q = round(x / scale_d + offset_d)``.
- Weights: per output channel, symmetric (offset_w = 0), ``scale_w[c] = max|w[c]| / 127``,
  ``w_q = clip(round_half_even(w / scale_w), -127, 127)``; a channel whose weights are (nearly) zero (trained
  PaddlePaddle models have channels with max|w| ~ 1e-34) gets at least the scale its bias needs to fit the int32
  bias with room to spare, ``|b[c]| / (scale_d * 2**30)``: its weights quantize to 0, which they are.
- Bias: int32 ``round_half_even(b / (scale_d * scale_w[c]))``; a bias beyond int32 is an error.
- ``deq_scale[c] = float32(scale_d * scale_w[c])`` (the low word of AscendDequant's uint64).
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedNetworkError

QMIN, QMAX = -128, 127
WMAX = 127
BIAS_LIMIT = 2 ** 30   # an int32 bias stays below this, leaving the accumulator room for the products
# AscendQuant multiplies by 1/scale_d as a float16: keep it finite and normal (<= 2**15)
MIN_SCALE_D = 2.0 ** -15


def act_qparams(lo: float, hi: float) -> tuple[float, int]:
    """(scale_d, offset_d) of an int8 tensor covering [lo, hi] and 0."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = max((hi - lo) / (QMAX - QMIN), MIN_SCALE_D)
    offset = int(np.clip(np.round(QMIN - lo / scale), QMIN, QMAX))
    return float(scale), offset


def quant_scale(scale_d: float) -> np.float32:
    """AscendQuant's ``scale`` attribute (a float32 in the deploy graph); the device applies it as float16."""
    return np.float32(1.0 / scale_d)


def weight_channel_axis(op: str, attrs: dict) -> int:
    """The output-channel axis of a quantized op's weight (Conv2D: 0; MatMul: N)."""
    if op == "Conv2D":
        return 0
    return 0 if attrs.get("transpose_b") else 1


def quantize_weight(w: np.ndarray, axis: int, bias: np.ndarray | None = None,
                    scale_d: float | None = None, min_scale: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(w_q int8, scale_w float64 per output channel); given the float ``bias`` and the input's ``scale_d``, no
    channel's scale is so small that its bias leaves int32 (module doc); nor, given ``min_scale`` (per output
    channel, 0 for none), below that."""
    wm = np.moveaxis(np.asarray(w, np.float64), axis, 0)
    amax = np.abs(wm.reshape(wm.shape[0], -1)).max(axis=1)
    scale = np.where(amax > 0, amax / WMAX, 1.0)
    if bias is not None:
        scale = np.maximum(scale, np.abs(np.asarray(bias, np.float64)) / (scale_d * BIAS_LIMIT))
    if min_scale is not None:
        scale = np.maximum(scale, np.asarray(min_scale, np.float64))
    q = np.clip(np.rint(wm / scale.reshape((-1,) + (1,) * (wm.ndim - 1))), -WMAX, WMAX)
    return np.moveaxis(q, 0, axis).astype(np.int8), scale


def quantize_bias(b: np.ndarray | None, scale_d: float, scale_w: np.ndarray, layer: str) -> np.ndarray:
    if b is None:
        return np.zeros(len(scale_w), np.int32)
    q = np.rint(np.asarray(b, np.float64) / (scale_d * scale_w))
    bad = np.flatnonzero(np.abs(q) > np.iinfo(np.int32).max)
    if bad.size:
        c = int(bad[0])
        raise UnsupportedNetworkError(
            f"layer {layer}: bias of output channel {c} ({float(b[c]):.6g}) does not fit int32 at scale "
            f"scale_d*scale_w = {scale_d * scale_w[c]:.3g} (the input range or the weights of this channel are "
            f"too small for its bias)")
    return q.astype(np.int32)


def deq_scale(scale_d: float, scale_w: np.ndarray) -> np.ndarray:
    return (np.float64(scale_d) * np.asarray(scale_w, np.float64)).astype(np.float32)


def deq_scale_uint64(deq: np.ndarray) -> np.ndarray:
    """AscendDequant's uint64 form on v200 SoCs (Ascend310P): float32 bits in the low word."""
    return np.asarray(deq, np.float32).view(np.uint32).astype(np.uint64)
