"""AIPP as the device computes it: a static ``aipp_op`` configuration (its key/values, as
``quantflow.backends.aipp.parse`` reads them) applied to the raw uint8 frame the device receives, and the
frames themselves, made from images as OpenCV decodes them.

The steps, in the documented order (CANN ATC "Configuration File Template", atlasatc_16_0025: "channel swap
(rbuv_swap_switch) -> cropping -> CSC -> mean subtraction/normalization -> padding"):

1. swap: ``rbuv_swap_switch`` swaps R and B of RGB888_U8 / XRGB8888_U8 frames; ``ax_swap_switch`` moves the X
   byte of an XRGB8888_U8 pixel to the back (the chip keeps the first three of the four channels: Ascend C
   SetAippFunctions, "discards the fourth channel, keeping XRG").  For YUV420SP_U8 the swap exchanges U and V
   (NV21 input), which quantflow does not verify (DVPP/VDEC write NV12 by default) and refuses.
2. crop: ``load_start_pos_w/h``, ``crop_size_w/h`` inside the ``src_image_size_w/h`` frame.
3. CSC (``csc_switch``, YUV420SP_U8 only): ``out_k = (sum_j matrix_rkcj * (in_j - input_bias_j)) >> 8``,
   the ATC CSC formula (atlasatc_16_0021); row k of the matrix is output channel k.
4. DTC: ``out_chn_i = (pixel_chn_i - mean_chn_i - min_chn_i) * var_reci_chn_i`` with ``min_chn_i`` and
   ``var_reci_chn_i`` float16 values and a float16 output (the TBE ``aipp_comm.py`` packs them with fp16 on
   Ascend310P-class SoCs); that output feeds the first AscendQuant.
5. padding: ``top/bottom/left/right_padding_size`` border pixels get ``padding_value`` as the *output* value
   (float16), not pushed through DTC (TBE 8.1 ``aipp_comm.py``: the value is packed into SPR8 in the output
   dtype; ``aipp_resize_padding.py`` writes top/bottom rows into the output directly).

Assumptions (what no CANN source or page read for quantflow documents; each can be settled on a 310P by dumping
the Aipp op's output for crafted frames, see README "On an Ascend host"):

- ``>> 8`` is an arithmetic shift of the exact integer sum: floor division by 256, toward minus infinity for
  negative sums too; the result is then saturated to [0, 255] (an 8-bit pixel path) before DTC.
- YUV420SP chroma is upsampled by replication: each 2x2 block of Y uses its one (U, V) pair, as OpenCV's NV12
  decoder does (``color_yuv.simd.hpp``).
- XRGB8888_U8: the R/B swap acts on the three colour channels kept after the X move.
- DTC is computed exactly and rounded once to float16.
- Older CANN (TBE of 2020) wrote 0 instead of ``padding_value`` into the top and bottom padding rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

from ..errors import AippMismatchError

# input_format -> channels of the AIPP output, i.e. of the model input it feeds
SUPPORTED_FORMATS = {"RGB888_U8": 3, "YUV400_U8": 1, "YUV420SP_U8": 3, "XRGB8888_U8": 3}
MAX_PADDING = 32            # per side (TBE aipp_comm.py: "The max padding size is 32"; aclmdlSetAIPPPaddingParams)
MAX_PADDED_WIDTH_310P = 1080  # TBE 8.1 aipp_comm.py: after padding, the output w <= 1080 on Ascend310P
MAX_IMAGE_SIZE = 4096       # src_image_size_w/h, crop_size_w/h (aclAippInfo: "Value range: [1, 4096]")
XRGB_X = 255                # the X byte of the XRGB8888_U8 frames quantflow makes (opaque alpha); AIPP drops it


# ----------------------------------------------------------------------------- colour standards

@dataclass(frozen=True)
class ColorStandard:
    """A YUV standard: its defining luma weights and range, and AIPP's documented integer YUV -> RGB matrix
    for it (Huawei Cloud "CSC Configuration", atlasmcg_05_c30_0009: JPEG, BT-601NARROW, BT-709NARROW)."""
    name: str
    kr: float
    kb: float
    full_range: bool
    matrix_rgb: tuple          # rows R, G, B (Q8 integers)
    input_bias: tuple          # Y, U, V
    label: str

    def matrix(self, order: str) -> np.ndarray:
        """The integer matrix whose rows give ``order`` ("RGB" or "BGR": rows 0 and 2 swapped)."""
        m = np.array(self.matrix_rgb, np.int64)
        return m[::-1].copy() if order == "BGR" else m

    def exact_rgb(self) -> np.ndarray:
        """The exact YUV -> RGB matrix (rows R, G, B; applied to YUV minus ``input_bias``), from Kr, Kb and the
        range: R = sy*Y' + sc*2(1-Kr)*V', B = sy*Y' + sc*2(1-Kb)*U', G from Y = Kr*R + Kg*G + Kb*B."""
        kr, kb = self.kr, self.kb
        kg = 1.0 - kr - kb
        sy, sc = (1.0, 1.0) if self.full_range else (255.0 / 219.0, 255.0 / 224.0)
        rv, bu = sc * 2 * (1 - kr), sc * 2 * (1 - kb)
        return np.array([[sy, 0.0, rv], [sy, -kb * bu / kg, -kr * rv / kg], [sy, bu, 0.0]])

    def exact_yuv(self) -> tuple[np.ndarray, np.ndarray]:
        """(matrix, offset): YUV = matrix @ [R, G, B] + offset, the exact forward transform."""
        kr, kb = self.kr, self.kb
        kg = 1.0 - kr - kb
        sy, sc = (1.0, 1.0) if self.full_range else (219.0 / 255.0, 224.0 / 255.0)
        y = np.array([kr, kg, kb])
        u = (np.array([0.0, 0.0, 1.0]) - y) / (2 * (1 - kb))
        v = (np.array([1.0, 0.0, 0.0]) - y) / (2 * (1 - kr))
        return np.stack([sy * y, sc * u, sc * v]), np.array(self.input_bias, np.float64)


STANDARDS = {s.name: s for s in (
    ColorStandard("bt601_narrow", 0.299, 0.114, False, ((298, 0, 409), (298, -100, -208), (298, 516, 0)),
                  (16, 128, 128), "BT.601 narrow range (GE's default for YUV420SP_U8; OpenCV's YUV I420/NV12)"),
    ColorStandard("bt601_full", 0.299, 0.114, True, ((256, 0, 359), (256, -88, -183), (256, 454, 0)),
                  (0, 128, 128), "BT.601 full range (JPEG; OpenCV's YCrCb)"),
    ColorStandard("bt709_narrow", 0.2126, 0.0722, False, ((298, 0, 459), (298, -55, -136), (298, 541, 0)),
                  (16, 128, 128), "BT.709 narrow range (HD video)"),
)}
DEFAULT_STANDARD = "bt601_narrow"


def csc_error_bound(standard: ColorStandard, decoder: np.ndarray | None = None) -> np.ndarray:
    """Per output channel (R, G, B), the largest difference in pixel levels between AIPP's integer CSC (as
    modelled here) and a decoder rounding ``decoder`` (rows R, G, B; default the exact matrix) to uint8, on any
    uint8 YUV: 1 level for the ``>> 8`` floor, 0.5 for the decoder's rounding, and how far each matrix is from
    the exact one at the largest |YUV - bias| a uint8 frame holds (saturation to [0, 255] only brings both
    closer)."""
    exact = standard.exact_rgb()
    q8 = np.array(standard.matrix_rgb, np.float64) / 256.0
    reach = np.array([max(b, 255 - b) for b in standard.input_bias], np.float64)
    off = np.zeros_like(exact) if decoder is None else np.abs(np.asarray(decoder, np.float64) - exact)
    return 1.0 + 0.5 + (np.abs(q8 - exact) + off) @ reach


def identify_matrix(params: dict) -> tuple[ColorStandard, str]:
    """The standard and row order ("RGB" or "BGR") of a config's CSC matrix and input bias; a matrix that is none
    of ``STANDARDS`` cannot be verified (quantflow could not make the frames it expects)."""
    m = np.array([[_int(params, f"matrix_r{r}c{c}", None) for c in range(3)] for r in range(3)], dtype=object)
    bias = tuple(_int(params, f"input_bias_{i}", None) for i in range(3))
    if any(v is None for v in m.ravel()) or None in bias:
        raise AippMismatchError("AIPP csc_switch true: write matrix_r0c0 .. matrix_r2c2 and input_bias_0 .. 2 "
                                "explicitly (GE's default when they are omitted is the BGR-order BT.601 narrow "
                                "matrix, which quantflow does not assume)")
    for s in STANDARDS.values():
        for order in ("RGB", "BGR"):
            if np.array_equal(m.astype(np.int64), s.matrix(order)) and bias == s.input_bias:
                return s, order
    rows = " / ".join(" ".join(str(v) for v in row) for row in m)
    raise AippMismatchError(f"AIPP CSC matrix {rows} with input_bias {' '.join(map(str, bias))} is none of the "
                            f"documented YUV -> RGB/BGR matrices quantflow verifies ({', '.join(STANDARDS)})")


# ----------------------------------------------------------------------------- reading a config

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


def _int(params: dict, key: str, default, lo: int | None = None, hi: int | None = None):
    v = params.get(key)
    if v is None:
        return default
    try:
        i = int(v)
    except ValueError:
        raise AippMismatchError(f"AIPP {key}: expected an integer, got {v!r}") from None
    if (lo is not None and i < lo) or (hi is not None and i > hi):
        raise AippMismatchError(f"AIPP {key}: must be in [{lo}, {hi}], got {i}")
    return i


def _float16(params: dict, key: str, default: float) -> np.float16:
    v = _num(params, key, default)
    if not (math.isfinite(v) and abs(v) <= 65504.0):
        raise AippMismatchError(f"AIPP {key}: must be a finite float16 value (|v| <= 65504), got {params.get(key)}")
    return np.float16(v)


@dataclass(frozen=True)
class Aipp:
    """A static AIPP config, read and range-checked (``spec``)."""
    input_format: str
    src: tuple[int, int]                       # (w, h); 0 = not given
    rbuv_swap: bool
    ax_swap: bool
    crop: tuple[int, int, int, int] | None     # (x, y, w, h)
    csc: tuple[ColorStandard, str] | None      # (standard, row order)
    padding: tuple[int, int, int, int]         # (top, bottom, left, right)
    padding_value: np.float16
    mean: tuple[float, ...]
    min: tuple[np.float16, ...]
    var_reci: tuple[np.float16, ...]

    @property
    def channels(self) -> int:
        return SUPPORTED_FORMATS[self.input_format]

    def output_size(self, frame_hw: tuple[int, int]) -> tuple[int, int]:
        """(H, W) of the AIPP output for a frame of ``frame_hw``."""
        h, w = (self.crop[3], self.crop[2]) if self.crop else frame_hw
        t, b, left, r = self.padding
        return h + t + b, w + left + r

    def region(self, out_hw: tuple[int, int]) -> tuple[int, int, int, int]:
        """(top, left, h, w): where in an output of ``out_hw`` the frame's (cropped) pixels land."""
        t, b, left, r = self.padding
        return t, left, out_hw[0] - t - b, out_hw[1] - left - r


def spec(params: dict) -> Aipp:
    """A parsed ``aipp_op`` block as an ``Aipp``; anything quantflow cannot verify, or out of the documented
    ranges, is an ``AippMismatchError`` naming the key."""
    if params.get("aipp_mode", "static") != "static":
        raise AippMismatchError(f"only static AIPP can be verified, got aipp_mode {params.get('aipp_mode')}")
    fmt = params.get("input_format")
    if fmt not in SUPPORTED_FORMATS:
        raise AippMismatchError(f"AIPP input_format {fmt!r} cannot be verified (supported: {', '.join(SUPPORTED_FORMATS)})")
    if _bool(params, "resize"):
        raise AippMismatchError("AIPP resize true cannot be verified (resize is not available on Ascend310P)")
    src = (_int(params, "src_image_size_w", 0, 0, MAX_IMAGE_SIZE), _int(params, "src_image_size_h", 0, 0, MAX_IMAGE_SIZE))
    rbuv, ax = _bool(params, "rbuv_swap_switch"), _bool(params, "ax_swap_switch")
    if fmt == "YUV420SP_U8" and rbuv:
        raise AippMismatchError("AIPP rbuv_swap_switch true with YUV420SP_U8 means NV21 frames, which quantflow does not "
                                "verify: DVPP/VDEC write NV12 by default (feed NV12 and set rbuv_swap_switch false)")
    if ax and fmt != "XRGB8888_U8":
        raise AippMismatchError(f"AIPP ax_swap_switch true applies to XRGB8888_U8 frames, not {fmt}")
    crop = None
    if _bool(params, "crop"):
        crop = (_int(params, "load_start_pos_w", 0, 0, MAX_IMAGE_SIZE - 1),
                _int(params, "load_start_pos_h", 0, 0, MAX_IMAGE_SIZE - 1),
                _int(params, "crop_size_w", 0, 1, MAX_IMAGE_SIZE), _int(params, "crop_size_h", 0, 1, MAX_IMAGE_SIZE))
        if crop[2] == 0 or crop[3] == 0:
            raise AippMismatchError("AIPP crop true: give crop_size_w and crop_size_h")
        for axis, (pos, size, whole) in (("w", (crop[0], crop[2], src[0])), ("h", (crop[1], crop[3], src[1]))):
            if whole and pos + size > whole:
                raise AippMismatchError(f"AIPP load_start_pos_{axis} + crop_size_{axis} ({pos} + {size}) exceeds "
                                        f"src_image_size_{axis} ({whole})")
    if fmt == "YUV420SP_U8":
        odd = [f"{k} {v}" for k, v in (("src_image_size_w", src[0]), ("src_image_size_h", src[1])) + (
            (("load_start_pos_w", crop[0]), ("load_start_pos_h", crop[1]), ("crop_size_w", crop[2]),
             ("crop_size_h", crop[3])) if crop else ()) if v % 2]
        if odd:
            raise AippMismatchError(f"AIPP YUV420SP_U8: {', '.join(odd)} must be even (4:2:0 chroma blocks; TBE "
                                    f"aipp_comm.py and ATC's crop page require it)")
    csc = None
    if _bool(params, "csc_switch"):
        if fmt != "YUV420SP_U8":
            raise AippMismatchError(f"AIPP csc_switch true with {fmt} cannot be verified against the training "
                                    f"preprocessing (quantflow verifies YUV -> RGB/BGR conversion of YUV420SP_U8)")
        for r in range(3):
            for c in range(3):
                _int(params, f"matrix_r{r}c{c}", 0, -32768, 32767)
        for i in range(3):
            _int(params, f"input_bias_{i}", 0, 0, 255)
        csc = identify_matrix(params)
    elif fmt == "YUV420SP_U8":
        raise AippMismatchError("AIPP YUV420SP_U8 with csc_switch false gives YUV444 to the network, which is not "
                                "what it was trained on (RGB, BGR or GRAY): set csc_switch true with the matrix")
    padding = (0, 0, 0, 0)
    if _bool(params, "padding"):
        padding = tuple(_int(params, f"{side}_padding_size", 0, 0, MAX_PADDING) for side in ("top", "bottom", "left", "right"))
    channels = SUPPORTED_FORMATS[fmt]
    mean = []
    for i in range(channels):
        m = _num(params, f"mean_chn_{i}", 0.0)
        if not (0.0 <= m <= 255.0 and float(m).is_integer()):
            raise AippMismatchError(f"AIPP mean_chn_{i}: must be an integer in [0, 255] (a uint8 on the device), "
                                    f"got {params.get(f'mean_chn_{i}')}")
        mean.append(m)
    minimum = tuple(_float16(params, f"min_chn_{i}", 0.0) for i in range(channels))
    for i, v in enumerate(minimum):
        if not 0.0 <= v <= 255.0:
            raise AippMismatchError(f"AIPP min_chn_{i}: must be in [0, 255] (CANN's AIPP ranges), got "
                                    f"{params.get(f'min_chn_{i}')}")
    return Aipp(fmt, src, rbuv, ax, crop, csc, padding, _float16(params, "padding_value", 0.0), tuple(mean),
                minimum,
                tuple(_float16(params, f"var_reci_chn_{i}", 1.0) for i in range(channels)))


# ----------------------------------------------------------------------------- the device arithmetic

def upsample_chroma(plane: np.ndarray) -> np.ndarray:
    """A 4:2:0 chroma plane at full resolution: each sample over its 2x2 block (the modelled upsampling)."""
    return np.repeat(np.repeat(plane, 2, axis=0), 2, axis=1)


def csc(yuv: np.ndarray, matrix: np.ndarray, bias) -> np.ndarray:
    """AIPP's integer colour conversion of H,W,3 uint8 YUV: ``(matrix x (yuv - bias)) >> 8`` per pixel (an
    arithmetic shift of the int32 sum), saturated to [0, 255] (the modelled arithmetic, module doc)."""
    v = yuv.astype(np.int32) - np.asarray(bias, np.int32)
    acc = np.einsum("hwj,kj->hwk", v, np.asarray(matrix, np.int32))
    return np.clip(acc >> 8, 0, 255)


def _pixels(a: Aipp, frame: np.ndarray) -> np.ndarray:
    """Steps 1-3: the frame swapped, cropped and colour-converted, as H,W,C pixel values."""
    fmt = a.input_format
    if fmt == "YUV420SP_U8":
        if frame.ndim != 2 or frame.shape[0] % 3 or frame.shape[1] % 2:
            raise AippMismatchError(f"AIPP YUV420SP_U8 takes an NV12 frame of (H*3/2, W) bytes with H and W even, "
                                    f"got shape {frame.shape}")
        h, w = frame.shape[0] * 2 // 3, frame.shape[1]
        uv = frame[h:].reshape(h // 2, w // 2, 2)
        x = np.stack([frame[:h], upsample_chroma(uv[..., 0]), upsample_chroma(uv[..., 1])], axis=-1)
    else:
        x = frame if frame.ndim == 3 else frame[..., None]
        want = {"XRGB8888_U8": 4}.get(fmt, a.channels)
        if x.shape[2] != want:
            raise AippMismatchError(f"AIPP input_format {fmt} takes {want} channel(s), frame has {x.shape[2]}")
        if fmt == "XRGB8888_U8":
            x = (np.concatenate([x[..., 1:], x[..., :1]], axis=-1) if a.ax_swap else x)[..., :3]
        if a.channels == 3 and a.rbuv_swap:
            x = x[..., ::-1]
    w, h = a.src
    if (w and w != x.shape[1]) or (h and h != x.shape[0]):
        raise AippMismatchError(f"AIPP src_image_size {w}x{h} does not match the {x.shape[1]}x{x.shape[0]} frame")
    if a.crop:
        cx, cy, cw, ch = a.crop
        if cx + cw > x.shape[1] or cy + ch > x.shape[0]:
            raise AippMismatchError(f"AIPP crop {cw}x{ch} at ({cx}, {cy}) leaves the {x.shape[1]}x{x.shape[0]} frame")
        x = x[cy:cy + ch, cx:cx + cw]
    if a.csc:
        standard, order = a.csc
        x = csc(x, standard.matrix(order), standard.input_bias)
    return x


def apply(params: dict | Aipp, frame: np.ndarray) -> np.ndarray:
    """Apply a static AIPP config to one raw uint8 frame as the device receives it (HWC; HW for YUV400_U8;
    (H*3/2, W) NV12 for YUV420SP_U8; H,W,4 for XRGB8888_U8) -> float32 CHW holding the float16 output."""
    a = params if isinstance(params, Aipp) else spec(params)
    x = _pixels(a, frame).astype(np.float64)
    hw = a.output_size(x.shape[:2])
    out = np.full((a.channels,) + hw, float(a.padding_value), np.float64)
    t, left, h, w = a.region(hw)
    for i in range(a.channels):
        # exact in float64 (an integer, a float16 and a float16 product: < 53 bits), then one rounding to float16
        out[i, t:t + h, left:left + w] = (x[..., i] - a.mean[i] - float(a.min[i])) * float(a.var_reci[i])
    return out.astype(np.float16).astype(np.float32)


# ----------------------------------------------------------------------------- the frames the device receives

def encode_yuv420(bgr: np.ndarray, standard: ColorStandard) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Y, U, V) 4:2:0 planes of a BGR uint8 image (H, W even) as a camera pipeline in ``standard`` delivers them.
    BT.601 narrow: OpenCV's ``COLOR_BGR2YUV_I420`` (BT.601 limited range, chroma point-sampled at each 2x2 block's
    top-left pixel; ``color_yuv.simd.hpp``); BT.601 full: OpenCV's JPEG ``COLOR_BGR2YCrCb``; BT.709 narrow (no
    OpenCV conversion): the exact transform, rounded; the last two sampled like OpenCV's I420."""
    h, w = bgr.shape[:2]
    if standard.name == "bt601_narrow":
        i420 = cv2.cvtColor(np.ascontiguousarray(bgr), cv2.COLOR_BGR2YUV_I420)
        u = i420[h:h + h // 4].reshape(h // 2, w // 2)
        v = i420[h + h // 4:].reshape(h // 2, w // 2)
        return i420[:h], u, v
    if standard.name == "bt601_full":
        ycrcb = cv2.cvtColor(np.ascontiguousarray(bgr), cv2.COLOR_BGR2YCrCb)
        return ycrcb[..., 0], ycrcb[::2, ::2, 2], ycrcb[::2, ::2, 1]
    m, offset = standard.exact_yuv()
    yuv = np.clip(np.floor(bgr[..., ::-1].astype(np.float64) @ m.T + offset + 0.5), 0, 255).astype(np.uint8)
    return yuv[..., 0], yuv[::2, ::2, 1], yuv[::2, ::2, 2]


def nv12(y: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The NV12 frame: the Y plane, then U and V interleaved (shape (H*3/2, W))."""
    return np.concatenate([y, np.stack([u, v], axis=-1).reshape(u.shape[0], -1)])


def frame_geometry(a: Aipp, image_hw: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int, int, int],
                                                                 tuple[int, int, int, int]]:
    """For an image of the model's input size ``image_hw``: (frame (h, w), the frame's window (y, x, h, w) that
    AIPP keeps, the image's region (y, x, h, w) that window shows).  The image is the AIPP output; its padded
    border is not in the frame; without crop the frame is the window."""
    t, b, left, r = a.padding
    rh, rw = image_hw[0] - t - b, image_hw[1] - left - r
    if rh <= 0 or rw <= 0:
        raise AippMismatchError(f"AIPP padding {a.padding} (top, bottom, left, right) leaves nothing of the "
                                f"{image_hw[1]}x{image_hw[0]} model input")
    if a.crop:
        cx, cy, cw, ch = a.crop
        if (cw, ch) != (rw, rh):
            raise AippMismatchError(f"AIPP crop_size {cw}x{ch} plus padding must give the {image_hw[1]}x{image_hw[0]} "
                                    f"model input (the crop must be {rw}x{rh})")
        fw, fh = a.src[0] or cx + cw, a.src[1] or cy + ch
        return (fh, fw), (cy, cx, ch, cw), (t, left, rh, rw)
    fw, fh = a.src[0] or rw, a.src[1] or rh
    if (fw, fh) != (rw, rh):
        raise AippMismatchError(f"AIPP src_image_size {fw}x{fh} plus padding must give the {image_hw[1]}x{image_hw[0]} "
                                f"model input without crop (the frame must be {rw}x{rh})")
    return (fh, fw), (0, 0, rh, rw), (t, left, rh, rw)


def device_frame(params: dict | Aipp, image: np.ndarray, frame_order: str) -> np.ndarray:
    """The raw frame the device receives for ``image`` (uint8 BGR HWC or gray HW, as OpenCV reads it, at the model's
    input size), in the config's input format: RGB888_U8 / XRGB8888_U8 colours in ``frame_order`` (an X byte first
    for XRGB), YUV400_U8 the gray image, YUV420SP_U8 an NV12 frame in the standard of the config's CSC matrix.
    With crop, the image's region is placed at the crop window of a ``src_image_size`` frame whose other pixels
    are the region's edge reflected (the crop drops them); a padded border is not in the frame."""
    a = params if isinstance(params, Aipp) else spec(params)
    (fh, fw), (wy, wx, wh, ww), (ry, rx, rh, rw) = frame_geometry(a, image.shape[:2])
    region = image[ry:ry + rh, rx:rx + rw]
    frame = region if (fh, fw) == (rh, rw) else cv2.copyMakeBorder(
        np.ascontiguousarray(region), wy, fh - wy - wh, wx, fw - wx - ww, cv2.BORDER_REFLECT_101)
    fmt = a.input_format
    if fmt == "YUV400_U8":
        if frame.ndim != 2:
            raise AippMismatchError("AIPP YUV400_U8 takes single-channel (gray) images")
        return np.ascontiguousarray(frame)
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise AippMismatchError(f"AIPP {fmt} takes 3-channel (BGR) images, got shape {frame.shape}")
    if fmt == "YUV420SP_U8":
        if frame.shape[0] % 2 or frame.shape[1] % 2:
            raise AippMismatchError(f"AIPP YUV420SP_U8 frames are of even width and height, this one would be "
                                    f"{frame.shape[1]}x{frame.shape[0]} (set the crop or padding so that it is)")
        return nv12(*encode_yuv420(frame, a.csc[0]))
    colours = frame[..., ::-1] if frame_order == "RGB" else frame
    if fmt == "XRGB8888_U8":
        colours = np.concatenate([np.full(frame.shape[:2] + (1,), XRGB_X, np.uint8), colours], axis=-1)
    return np.ascontiguousarray(colours)


def aipp_batch(params: dict, images: np.ndarray, input_channel_order: str) -> np.ndarray:
    """The float16 AIPP output the device feeds the first layer, for uint8 images as OpenCV reads them (each made
    into the frame the device receives: ``device_frame``)."""
    a = spec(params)
    return np.stack([apply(a, device_frame(a, img, input_channel_order)) for img in images])
