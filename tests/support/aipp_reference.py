"""AIPP written out from CANN's documentation, independently of ``quantflow.engine.aipp`` (nothing is imported from
quantflow): the tests hold the implementation against it, and the ais_bench stand-in uses it as "the device".

Sources: ATC "Configuration File Template" (order: swap -> crop -> CSC -> mean/normalization -> padding), ATC CSC
page (``[R G B]^T = M . [Y - bias0, U - bias1, V - bias2]^T >> 8``), Huawei Cloud "CSC Configuration" (the
matrices), TBE aipp_comm.py (float16 min/var_reci; padding_value in the output type), the runtime's input sizes
(Huawei Cloud atlasmcg_05_c30_0012: "YUV420SP_U8 | N * src_image_size_w * src_image_size_h * 1.5").  Where the
documentation is silent quantflow's stated assumptions are taken: ``>> 8`` floors (also below zero), the result
saturates to [0, 255], chroma is replicated over its 2x2 block.
"""
from __future__ import annotations

import numpy as np

# Huawei Cloud "CSC Configuration": YUV420SP_U8 -> RGB888 (rows R, G, B), input_bias
MATRICES = {
    "bt601_narrow": (((298, 0, 409), (298, -100, -208), (298, 516, 0)), (16, 128, 128)),
    "bt601_full": (((256, 0, 359), (256, -88, -183), (256, 454, 0)), (0, 128, 128)),
    "bt709_narrow": (((298, 0, 459), (298, -55, -136), (298, 541, 0)), (16, 128, 128)),
}
BYTES_PER_PIXEL = {"YUV420SP_U8": 1.5, "RGB888_U8": 3, "XRGB8888_U8": 4, "YUV400_U8": 1}
OUT_CHANNELS = {"YUV420SP_U8": 3, "RGB888_U8": 3, "XRGB8888_U8": 3, "YUV400_U8": 1}


def read_config(text: str) -> dict:
    """``key : value`` lines of an ``aipp_op`` block (comments dropped)."""
    cfg = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if ":" in line:
            k, v = (s.strip() for s in line.split(":", 1))
            cfg[k] = v
    return cfg


def _on(cfg, key):
    return cfg.get(key, "false") in ("true", "1")


def _i(cfg, key, default=0):
    return int(cfg.get(key, default))


def frame_bytes(cfg: dict) -> int:
    """One frame's bytes at src_image_size (the runtime's input check)."""
    return int(_i(cfg, "src_image_size_w") * _i(cfg, "src_image_size_h") * BYTES_PER_PIXEL[cfg["input_format"]])


def csc_pixel(matrix, bias, y: int, u: int, v: int) -> list[int]:
    """One pixel through the CSC: per row, the integer sum, floored after dividing by 256, saturated."""
    out = []
    for row in matrix:
        s = row[0] * (y - bias[0]) + row[1] * (u - bias[1]) + row[2] * (v - bias[2])
        out.append(min(255, max(0, int(np.floor(s / 256.0)))))
    return out


def csc_planes(matrix, bias, y, u, v) -> np.ndarray:
    """``csc_pixel`` over whole planes (float64 arithmetic, exact for these integers), channels last."""
    y, u, v = (np.asarray(p, np.float64) for p in (y, u, v))
    chans = []
    for row in matrix:
        s = row[0] * (y - bias[0]) + row[1] * (u - bias[1]) + row[2] * (v - bias[2])
        chans.append(np.clip(np.floor(s / 256.0), 0, 255))
    return np.stack(chans, axis=-1)


def _pixels(cfg: dict, raw: np.ndarray) -> np.ndarray:
    """The frame (flat bytes or any shape) as H, W, C pixels after swap, crop and CSC."""
    fmt = cfg["input_format"]
    w, h = _i(cfg, "src_image_size_w"), _i(cfg, "src_image_size_h")
    b = np.asarray(raw, np.uint8).reshape(-1)
    if fmt == "YUV420SP_U8":
        y = b[:w * h].reshape(h, w)
        uv = b[w * h:w * h * 3 // 2].reshape(h // 2, w)
        rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        u = uv[rows // 2, (cols // 2) * 2]
        v = uv[rows // 2, (cols // 2) * 2 + 1]
        x = np.stack([y, u, v], axis=-1)
    elif fmt == "XRGB8888_U8":
        x = b.reshape(h, w, 4)
        if _on(cfg, "ax_swap_switch"):
            x = x[..., [1, 2, 3, 0]]
        x = x[..., :3]
        if _on(cfg, "rbuv_swap_switch"):
            x = x[..., [2, 1, 0]]
    elif fmt == "RGB888_U8":
        x = b.reshape(h, w, 3)
        if _on(cfg, "rbuv_swap_switch"):
            x = x[..., [2, 1, 0]]
    else:
        x = b.reshape(h, w, 1)
    if _on(cfg, "crop"):
        x0, y0 = _i(cfg, "load_start_pos_w"), _i(cfg, "load_start_pos_h")
        x = x[y0:y0 + _i(cfg, "crop_size_h"), x0:x0 + _i(cfg, "crop_size_w")]
    if _on(cfg, "csc_switch"):
        m = [[_i(cfg, f"matrix_r{r}c{c}") for c in range(3)] for r in range(3)]
        bias = [_i(cfg, f"input_bias_{i}") for i in range(3)]
        x = csc_planes(m, bias, x[..., 0], x[..., 1], x[..., 2])
    return x.astype(np.float64)


def aipp(cfg: dict, raw: np.ndarray) -> np.ndarray:
    """One frame -> the float16 AIPP output, C, H, W."""
    x = _pixels(cfg, raw)
    chans = []
    for i in range(OUT_CHANNELS[cfg["input_format"]]):
        mn = float(np.float16(float(cfg.get(f"min_chn_{i}", 0))))
        var = float(np.float16(float(cfg.get(f"var_reci_chn_{i}", 1))))
        chans.append(((x[..., i] - float(cfg.get(f"mean_chn_{i}", 0)) - mn) * var).astype(np.float16))
    out = np.stack(chans)
    if _on(cfg, "padding"):
        t, bo, le, ri = (_i(cfg, f"{s}_padding_size") for s in ("top", "bottom", "left", "right"))
        out = np.pad(out, ((0, 0), (t, bo), (le, ri)), constant_values=np.float16(float(cfg.get("padding_value", 0))))
    return out
