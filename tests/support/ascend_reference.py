"""An independent NumPy statement of the Ascend INT8 scheme, for checking the emulator bit for bit.

Written from the scheme's definition (docs/how-it-works.md "The INT8 scheme, emulated"), not from the emulator:
float16 values are NumPy float16 (IEEE binary16, round to nearest even), the cube's sums are
exact int64 over explicitly gathered windows, and every op between quantized ops works on
float16 values computed in float32.  It covers the ops the test networks use.
"""
from __future__ import annotations

import numpy as np

F16, F32 = np.float16, np.float32


def ascend_quant(x16: np.ndarray, scale_d: float, offset_d: int) -> np.ndarray:
    """AscendQuant: fp16 multiply by the float32 attribute 1/scale_d taken as fp16, fp16 add of the offset,
    round half to even, saturate."""
    t = (x16.astype(F16) * F16(F32(1.0 / scale_d))).astype(F16)
    t = (t + F16(offset_d)).astype(F16)
    return np.clip(np.rint(t.astype(np.float64)), -128, 127).astype(np.int64)


def conv_int(v: np.ndarray, w: np.ndarray, stride, pads, dilation, group) -> np.ndarray:
    """Exact integer convolution (N,C,H,W) x (O,C/g,kh,kw); pads (top, left, bottom, right)."""
    n, c, h, wd = v.shape
    o, cg, kh, kw = w.shape
    t, l, b, r = pads
    vp = np.zeros((n, c, h + t + b, wd + l + r), np.int64)
    vp[:, :, t:t + h, l:l + wd] = v
    oh = (h + t + b - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + l + r - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    og = o // group
    for g in range(group):
        vg = vp[:, g * cg:(g + 1) * cg]
        wg = w[g * og:(g + 1) * og].astype(np.int64)
        for i in range(kh):
            for j in range(kw):
                patch = vg[:, :, i * dilation[0]: i * dilation[0] + stride[0] * (oh - 1) + 1: stride[0],
                           j * dilation[1]: j * dilation[1] + stride[1] * (ow - 1) + 1: stride[1]]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, wg[:, :, i, j])
    return out


def ascend_dequant(acc: np.ndarray, deq_scale: np.ndarray, relu: bool, channel_axis: int = 1) -> np.ndarray:
    """AscendDequant: float32(acc) * float32 deq_scale[c], optional ReLU, to float16."""
    shape = [1] * acc.ndim
    shape[channel_axis] = -1
    y = acc.astype(F32) * deq_scale.astype(F32).reshape(shape)
    if relu:
        y = np.maximum(y, F32(0))
    return y.astype(F16)


def quantized_conv(x16, q, attrs) -> np.ndarray:
    v = ascend_quant(x16, q.scale_d, q.offset_d) - q.offset_d
    acc = conv_int(v, q.weight, attrs["strides"], attrs["pads"], attrs["dilations"], attrs["group"])
    acc = acc + q.bias.astype(np.int64).reshape(1, -1, 1, 1)
    assert np.abs(acc).max() < 2 ** 31, "int32 accumulator overflow"
    return ascend_dequant(acc, q.deq_scale, q.relu)


def quantized_dense(x16, q, transpose_b: bool) -> np.ndarray:
    v = ascend_quant(x16, q.scale_d, q.offset_d) - q.offset_d
    w = q.weight.astype(np.int64)
    acc = v @ (w.T if transpose_b else w) + q.bias.astype(np.int64)
    return ascend_dequant(acc, q.deq_scale, q.relu)


# ----------------------------------------------------------------------------- float16 ops

def f16(x) -> np.ndarray:
    return np.asarray(x, F32).astype(F16)


def relu(x16):
    return np.maximum(x16, F16(0))


def relu6(x16):
    return np.clip(x16, F16(0), F16(6))


def add(a16, b16):
    return f16(a16.astype(F32) + b16.astype(F32))


def max_pool(x16, k, s, pads):
    t, l, b, r = pads
    n, c, h, w = x16.shape
    xp = np.full((n, c, h + t + b, w + l + r), -np.inf, F32)
    xp[:, :, t:t + h, l:l + w] = x16
    oh, ow = (h + t + b - k[0]) // s[0] + 1, (w + l + r - k[1]) // s[1] + 1
    out = np.full((n, c, oh, ow), -np.inf, F32)
    for i in range(k[0]):
        for j in range(k[1]):
            out = np.maximum(out, xp[:, :, i:i + s[0] * (oh - 1) + 1:s[0], j:j + s[1] * (ow - 1) + 1:s[1]])
    return f16(out)


def mean_hw(x16):
    return f16(x16.astype(np.float64).mean(axis=(2, 3), keepdims=True).astype(F32))
