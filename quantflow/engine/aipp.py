"""AIPP as the device computes it: a static ``aipp_op`` configuration (its key/values, as
``quantflow.backends.aipp.parse`` reads them) applied to the raw uint8 frames the device receives.

    out_chn_i = (pixel_chn_i - mean_chn_i - min_chn_i) * var_reci_chn_i

after the R/B swap when ``rbuv_swap_switch`` is true, with ``min_chn_i`` and ``var_reci_chn_i`` float16 values
and the output float16 (the TBE ``aipp_comm.py`` packs them with fp16 on Ascend310P-class SoCs); that output
feeds the first AscendQuant.
"""
from __future__ import annotations

import numpy as np

from ..errors import AippMismatchError

SUPPORTED_FORMATS = {"RGB888_U8": 3, "YUV400_U8": 1}


def _bool(params: dict, key: str, default: bool = False) -> bool:
    v = params.get(key)
    if v is None:
        return default
    if v.lower() in ("true", "1"):
        return True
    if v.lower() in ("false", "0"):
        return False
    raise AippMismatchError(f"AIPP {key}: expected true/false, got {v!r}")


def _num(params: dict, key: str, default: float) -> float:
    v = params.get(key)
    if v is None:
        return default
    try:
        return float(v)
    except ValueError:
        raise AippMismatchError(f"AIPP {key}: expected a number, got {v!r}") from None


# ----------------------------------------------------------------------------- the AIPP formula

def apply(params: dict, frame: np.ndarray) -> np.ndarray:
    """Apply a static AIPP config to one raw uint8 frame (HWC, or HW for YUV400) -> float CHW."""
    if params.get("aipp_mode", "static") != "static":
        raise AippMismatchError(f"only static AIPP can be verified, got aipp_mode {params.get('aipp_mode')}")
    fmt = params.get("input_format")
    if fmt not in SUPPORTED_FORMATS:
        raise AippMismatchError(f"AIPP input_format {fmt!r} cannot be verified (supported: {', '.join(SUPPORTED_FORMATS)})")
    for key in ("crop", "resize", "padding", "csc_switch"):
        if _bool(params, key):
            raise AippMismatchError(f"AIPP {key} true cannot be verified against the training preprocessing")
    channels = SUPPORTED_FORMATS[fmt]
    x = frame if frame.ndim == 3 else frame[..., None]
    if x.shape[2] != channels:
        raise AippMismatchError(f"AIPP input_format {fmt} takes {channels} channel(s), frame has {x.shape[2]}")
    w, h = int(_num(params, "src_image_size_w", 0)), int(_num(params, "src_image_size_h", 0))
    if (w and w != x.shape[1]) or (h and h != x.shape[0]):
        raise AippMismatchError(f"AIPP src_image_size {w}x{h} does not match the {x.shape[1]}x{x.shape[0]} model input")
    if channels == 3 and _bool(params, "rbuv_swap_switch"):
        x = x[..., ::-1]
    x = x.astype(np.float32)
    out = np.empty((channels,) + x.shape[:2], np.float32)
    for i in range(channels):
        mean = _num(params, f"mean_chn_{i}", 0.0)
        if not (0.0 <= mean <= 255.0 and float(mean).is_integer()):
            raise AippMismatchError(f"AIPP mean_chn_{i}: must be an integer in [0, 255] (a uint8 on the device), "
                                    f"got {params.get(f'mean_chn_{i}')}")
        for key in (f"min_chn_{i}", f"var_reci_chn_{i}"):
            v = _num(params, key, 0.0)
            if not (np.isfinite(v) and abs(v) <= 65504.0):
                raise AippMismatchError(f"AIPP {key}: must be a finite float16 value (|v| <= 65504), got {params.get(key)}")
        mn = np.float16(_num(params, f"min_chn_{i}", 0.0))
        var = np.float16(_num(params, f"var_reci_chn_{i}", 1.0))
        out[i] = (x[..., i] - np.float32(mean) - np.float32(mn)) * np.float32(var)
    return out.astype(np.float16).astype(np.float32)


def device_frame(bgr_or_gray: np.ndarray, input_channel_order: str) -> np.ndarray:
    """The raw frame the device receives, from an image as OpenCV read it."""
    if input_channel_order == "RGB":
        return np.ascontiguousarray(bgr_or_gray[..., ::-1])
    return bgr_or_gray


def aipp_batch(params: dict, images: np.ndarray, input_channel_order: str) -> np.ndarray:
    """The float16 AIPP output the device feeds the first layer, for uint8 images as OpenCV reads them."""
    return np.stack([apply(params, device_frame(img, input_channel_order)) for img in images])
