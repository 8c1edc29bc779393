"""Decoding helpers shared by the op definitions (MindSpore attribute conventions)."""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedNetworkError

# mindspore/core/include/mindapi/base/types.h: enum PadMode { PAD = 0, SAME = 1, VALID = 2 }
_PAD_MODES = {0: "pad", 1: "same", 2: "valid"}
# enum Format { NCHW = 0, NHWC = 1, ... }
_FORMATS = {0: "NCHW", 1: "NHWC"}


def pad_mode(v) -> str:
    if isinstance(v, (int, np.integer)):
        return _PAD_MODES.get(int(v), str(v))
    return str(v).lower()


def data_format(v) -> str:
    if v is None:
        return "NCHW"
    if isinstance(v, (int, np.integer)):
        return _FORMATS.get(int(v), str(v))
    return str(v).upper()


def pair(v) -> tuple[int, int]:
    """A (h, w) pair from an int, a pair, or an NCHW 4-tuple."""
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    v = [int(i) for i in v]
    if len(v) == 4:
        return v[2], v[3]
    if len(v) == 1:
        return v[0], v[0]
    return v[0], v[1]


def same_pads(size: int, k: int, s: int, d: int = 1) -> tuple[int, int]:
    """TensorFlow/MindSpore 'same': output ceil(size/s), the odd pixel of padding at the end."""
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


def spatial_pads(mode: str, hw: tuple[int, int], kernel, stride, dilation=(1, 1), explicit=(0, 0, 0, 0),
                 node: str = "?") -> list[int]:
    """ONNX pads [top, left, bottom, right] for a MindSpore pad mode."""
    if mode == "valid":
        return [0, 0, 0, 0]
    if mode == "same":
        (t, b), (l, r) = (same_pads(hw[i], kernel[i], stride[i], dilation[i]) for i in range(2))
        return [t, l, b, r]
    if mode == "pad":
        t, b, l, r = (int(p) for p in explicit)
        return [t, l, b, r]
    raise UnsupportedNetworkError(f"node {node}: unsupported pad_mode {mode!r}")


def norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def as_ints(v) -> list[int]:
    if isinstance(v, (int, np.integer)):
        return [int(v)]
    return [int(i) for i in np.asarray(v).reshape(-1)]
