"""The AIPP configuration file (CANN ``aipp_op`` format): generated from the training normalization, read back,
and verified numerically.

The config is rendered from a template (quantflow ships one per input format: ``quantflow.aipp_templates``),
then **read back from the written file** and applied as the device computes it (``quantflow.engine.aipp``) to
the frames the device receives for real calibration images.  The result must match the training
preprocessing -- the ``normalization.reference`` callable when configured, otherwise the declared mean/std --
or the build fails showing both values.

What is compared:

- RGB888_U8, XRGB8888_U8, YUV400_U8: the frame holds the image's pixels exactly, so AIPP's output must equal
  the training preprocessing of the image within ``aipp.tolerance`` (relative to max(1, |value|): the float16
  output and parameters).
- YUV420SP_U8: the frame holds what a camera's YUV 4:2:0 holds, not the image: chroma is sampled once per 2x2
  block, and the colour conversion is an integer matrix.  AIPP's output is compared with the training
  preprocessing of *the image the frame decodes to* -- the frame decoded to BGR by a reference decoder of its
  standard (OpenCV's own for BT.601 narrow and full; the exact BT.709 transform) -- within the tolerance plus
  the colour-conversion bound (``engine.aipp.csc_error_bound`` against that decoder, times ``var_reci``).  How
  far that is from the training preprocessing of the original image (the cost of 4:2:0 and of the integer
  conversion) is reported, not bounded: the accuracy gate, which feeds the same frames, measures what it does
  to the network.
- crop: the frame is larger than the model input; only the crop window reaches the network (compared as above).
- padding: the padded border is ``padding_value`` by construction (the device writes it after DTC); the check
  compares the rest and reports how far the training preprocessing's border is from ``padding_value``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from string import Template

import cv2
import numpy as np

from .. import aipp_templates
from ..data.images import read_image
from ..engine.aipp import (DEFAULT_STANDARD, STANDARDS, Aipp, ColorStandard, apply, csc_error_bound, device_frame,
                           frame_geometry, spec, upsample_chroma)
from ..errors import AippMismatchError, ConfigError

_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(\S+)\s*$")
_INDENT = "\n    "  # continuation lines of a ${crop} / ${padding} block, as the shipped templates indent


# ----------------------------------------------------------------------------- generation

@dataclass(frozen=True)
class Geometry:
    """Where the model input comes from in the frame: the frame size (w, h), the crop window (x, y, w, h) or None,
    the padding (top, bottom, left, right) and the output value of padded pixels."""
    src: tuple[int, int]
    crop: tuple[int, int, int, int] | None = None
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    padding_value: float = 0.0


def default_format(channels: int) -> str:
    return "RGB888_U8" if channels == 3 else "YUV400_U8"


def aipp_values(input_shape, mean, std, scale: str, channel_order: str, input_channel_order: str, *,
                input_format: str | None = None, color_matrix: str | None = None,
                geometry: Geometry | None = None) -> dict:
    """Template values reproducing ((pixel [/255]) - mean) / std for frames of ``input_format`` (default: RGB888_U8
    or YUV400_U8 by channel count): the swaps, the CSC matrix (YUV420SP_U8: ``color_matrix``, rows in
    ``channel_order``), the crop and padding (``geometry``; default: the whole model input) and DTC.  ``${crop}``
    and ``${padding}`` are whole blocks of lines (``crop : false`` alone when off); the single keys are there too."""
    _, c, h, w = input_shape
    fmt = input_format or default_format(c)
    g = geometry or Geometry((w, h))
    k = 255.0 if scale == "0-1" else 1.0
    rgb_frames = fmt in ("RGB888_U8", "XRGB8888_U8")
    values = {"src_image_size_w": str(g.src[0]), "src_image_size_h": str(g.src[1]),
              "rbuv_swap_switch": "true" if (rgb_frames and c == 3 and input_channel_order != channel_order) else "false",
              "ax_swap_switch": "true" if fmt == "XRGB8888_U8" else "false",
              "csc_switch": "true" if fmt == "YUV420SP_U8" else "false"}
    if fmt == "YUV420SP_U8":
        standard = STANDARDS[color_matrix or DEFAULT_STANDARD]
        m = standard.matrix(channel_order)
        values.update({f"matrix_r{r}c{cc}": str(int(m[r, cc])) for r in range(3) for cc in range(3)})
        values.update({f"input_bias_{i}": str(b) for i, b in enumerate(standard.input_bias)})
    x, y, cw, ch = g.crop or (0, 0, 0, 0)
    crop = {"crop": "true" if g.crop else "false", "load_start_pos_w": str(x), "load_start_pos_h": str(y),
            "crop_size_w": str(cw), "crop_size_h": str(ch)}
    sides = dict(zip(("top", "bottom", "left", "right"), g.padding))
    padding = {"padding": "true" if any(g.padding) else "false",
               **{f"{side}_padding_size": str(n) for side, n in sides.items()},
               "padding_value": f"{float(np.float16(g.padding_value)):.9g}"}
    values.update(crop)
    values.update(padding)
    values["crop"] = _INDENT.join(f"{key} : {v}" for key, v in crop.items()) if g.crop else "crop : false"
    values["padding"] = (_INDENT.join(f"{key} : {v}" for key, v in padding.items()) if any(g.padding)
                         else "padding : false")
    for i, (m_, s_) in enumerate(zip(mean, std)):
        # AIPP subtracts mean_chn_i (a uint8) and min_chn_i (in [0, 255]): the pixel-domain mean must be in [0, 510]
        m255 = m_ * k
        if not 0.0 <= m255 <= 510.0:
            raise ConfigError(f"normalization.mean[{i}] = {m_:g} is {m255:g} in pixels: AIPP subtracts mean_chn_{i} "
                              f"(an integer in [0, 255]) and min_chn_{i} (in [0, 255]), so it can subtract 0 to 510 "
                              f"only; a training normalization outside that range cannot run in AIPP (check "
                              f"normalization.scale)")
        base = int(min(math.floor(m255), 255))
        values[f"mean_chn_{i}"] = str(base)
        values[f"min_chn_{i}"] = f"{m255 - base:.6f}"
        values[f"var_reci_chn_{i}"] = f"{1.0 / (s_ * k):.9g}"
    return values


def render(template_path: Path, values: dict) -> str:
    template_path = Path(template_path)
    if not template_path.is_file():
        shipped = ", ".join(aipp_templates.shipped())
        raise ConfigError(f"aipp.template: file not found: {template_path} (or name a template shipped with "
                          f"quantflow: {shipped})")
    text = template_path.read_text()
    try:
        return Template(text).substitute(values)
    except KeyError as err:
        raise ConfigError(f"aipp.template {template_path}: placeholder ${{{err.args[0]}}} has no value "
                          f"(available: {', '.join(sorted(values))})") from None
    except ValueError as err:
        raise ConfigError(f"aipp.template {template_path}: {err}") from None


# ----------------------------------------------------------------------------- parsing

def parse(text: str, source: str = "<aipp config>") -> dict:
    """The key/values of the (single) ``aipp_op { ... }`` block of a CANN AIPP config."""
    blocks, current = [], None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if re.fullmatch(r"aipp_op\s*\{", line):
            if current is not None:
                raise AippMismatchError(f"{source}:{lineno}: nested aipp_op block")
            current = {}
            continue
        if line == "}":
            if current is None:
                raise AippMismatchError(f"{source}:{lineno}: '}}' without aipp_op")
            blocks.append(current)
            current = None
            continue
        m = _LINE.match(line)
        if not m or current is None:
            raise AippMismatchError(f"{source}:{lineno}: cannot parse {raw.strip()!r}")
        key, value = m.groups()
        if key in current:
            raise AippMismatchError(f"{source}:{lineno}: {key} given twice")
        current[key] = value
    if current is not None:
        raise AippMismatchError(f"{source}: aipp_op block not closed")
    if len(blocks) != 1:
        raise AippMismatchError(f"{source}: expected one aipp_op block, found {len(blocks)}")
    return blocks[0]


# the rank of the image input in every graph quantflow writes (the graph IR's first input; its other inputs,
# ``model.inputs``, after it): AIPP applies to it alone.  CANN ATC, "Static AIPP": related_input_rank names the model
# input (0 the first) an aipp_op block applies to
IMAGE_INPUT_RANK = 0


def check_input_rank(params: dict, source: str) -> None:
    """The aipp_op block applies to the image input (``IMAGE_INPUT_RANK``)."""
    rank = params.get("related_input_rank", str(IMAGE_INPUT_RANK))
    if rank != str(IMAGE_INPUT_RANK):
        raise AippMismatchError(f"{source}: related_input_rank is {rank}; AIPP feeds the image input, the first input "
                                f"({IMAGE_INPUT_RANK}) of the graphs quantflow writes: set related_input_rank : "
                                f"{IMAGE_INPUT_RANK}")


def describe(params: dict, channels: int) -> str:
    parts = [f"input_format={params.get('input_format')}"]
    if params.get("input_format") in ("RGB888_U8", "XRGB8888_U8"):
        parts.append(f"rbuv_swap_switch={params.get('rbuv_swap_switch', 'false')}")
    if params.get("csc_switch", "false").lower() in ("true", "1"):
        parts.append("matrix " + " / ".join(" ".join(params.get(f"matrix_r{r}c{c}", "?") for c in range(3))
                                            for r in range(3))
                     + " input_bias " + " ".join(params.get(f"input_bias_{i}", "?") for i in range(3)))
    if params.get("crop", "false").lower() in ("true", "1"):
        parts.append(f"crop {params.get('crop_size_w')}x{params.get('crop_size_h')} at "
                     f"({params.get('load_start_pos_w', '0')}, {params.get('load_start_pos_h', '0')})")
    if params.get("padding", "false").lower() in ("true", "1"):
        parts.append("padding " + " ".join(f"{side}={params.get(f'{side}_padding_size', '0')}"
                                           for side in ("top", "bottom", "left", "right"))
                     + f" value={params.get('padding_value', '0')}")
    for i in range(channels):
        parts.append(f"chn_{i}: mean={params.get(f'mean_chn_{i}', '0')} min={params.get(f'min_chn_{i}', '0')} "
                     f"var_reci={params.get(f'var_reci_chn_{i}', '1')}")
    return "; ".join(parts)


# ----------------------------------------------------------------------------- reference decoders (YUV420SP_U8)

# The decoder each standard's frames are compared through, with its coefficients (rows R, G, B on YUV - bias) for
# the colour-conversion bound.  OpenCV's NV12 decoder: 20-bit constants ITUR_BT_601_CY .. CVR of
# modules/imgproc/src/color_yuv.simd.hpp (one U, V per 2x2 block; Y - 16 clamped at 0, which frames of Y >= 16,
# as OpenCV's encoder writes, never meet).  OpenCV's YCrCb decoder: colors.markdown, "RGB <-> YCrCb JPEG":
# R = Y + 1.403 (Cr - 128), G = Y - 0.714 (Cr - 128) - 0.344 (Cb - 128), B = Y + 1.773 (Cb - 128).
_CV_NV12 = np.array([[1220542, 0, 1673527], [1220542, -409993, -852492], [1220542, 2116026, 0]]) / 2.0 ** 20
_CV_YCRCB = np.array([[1.0, 0.0, 1.403], [1.0, -0.344, -0.714], [1.0, 1.773, 0.0]])
DECODERS = {"bt601_narrow": ("OpenCV COLOR_YUV2BGR_NV12", _CV_NV12),
            "bt601_full": ("OpenCV COLOR_YCrCb2BGR, chroma replicated over each 2x2 block", _CV_YCRCB),
            "bt709_narrow": ("the exact BT.709 narrow-range transform, rounded, chroma replicated over each 2x2 "
                             "block", None)}


def decode(frame: np.ndarray, standard: ColorStandard) -> np.ndarray:
    """An NV12 frame decoded to a BGR uint8 image by the standard's reference decoder (``DECODERS``)."""
    if standard.name == "bt601_narrow":
        return cv2.cvtColor(np.ascontiguousarray(frame), cv2.COLOR_YUV2BGR_NV12)
    h = frame.shape[0] * 2 // 3
    uv = frame[h:].reshape(h // 2, frame.shape[1] // 2, 2)
    y, u, v = frame[:h], upsample_chroma(uv[..., 0]), upsample_chroma(uv[..., 1])
    if standard.name == "bt601_full":
        return cv2.cvtColor(np.stack([y, v, u], axis=-1), cv2.COLOR_YCrCb2BGR)
    yuv = np.stack([y, u, v], axis=-1).astype(np.float64) - np.array(standard.input_bias, np.float64)
    rgb = np.clip(np.floor(yuv @ standard.exact_rgb().T + 0.5), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(rgb[..., ::-1])


def seen_image(a: Aipp, frame: np.ndarray, image: np.ndarray) -> np.ndarray:
    """``image`` as the frame shows it: for YUV420SP_U8 the region the crop keeps, decoded (``decode``), put in
    place of the image's pixels; otherwise the image itself (the frame holds its pixels exactly)."""
    if a.input_format != "YUV420SP_U8":
        return image
    _, (wy, wx, wh, ww), (ry, rx, rh, rw) = frame_geometry(a, image.shape[:2])
    seen = image.copy()
    seen[ry:ry + rh, rx:rx + rw] = decode(frame, a.csc[0])[wy:wy + wh, wx:wx + ww]
    return seen


# ----------------------------------------------------------------------------- verification

def raw_pixels(std, scale: str) -> bool:
    """std 1 on the 0-255 scale: the network takes pixel values as they are, or less a per-channel mean (YOLOX and
    many detectors; Caffe's [104, 117, 123]).  A legitimate declaration, whose values span 0..255 by design."""
    return scale == "0-255" and all(float(s) == 1.0 for s in std)


def plausibility(ref: np.ndarray, norm_desc: str) -> None:
    """Catch a normalization in the wrong pixel domain when there is no reference to compare to: mean/std of the
    0-1 domain with scale "0-255" (values in the hundreds) or of the 0-255 domain with scale "0-1" (values crushed
    near a constant).  A raw-pixel declaration (``raw_pixels``) is not checked here."""
    axes = (0, 2, 3)
    mean, std = ref.mean(axis=axes), ref.std(axis=axes)
    for i, (m, s) in enumerate(zip(mean, std)):
        if abs(m) > 10.0 or s > 20.0 or s < 1e-2:
            raise AippMismatchError(
                f"the declared normalization ({norm_desc}) turns the calibration images into channel {i} "
                f"values of mean {m:.3f} and std {s:.3f}, far from the ~0 / ~1 a training normalization gives: "
                f"are mean/std given in the 0-1 domain with scale = \"0-255\" (or the reverse)?")


def _reference(reference, img: np.ndarray, shape, path) -> np.ndarray:
    r = np.asarray(reference(img), np.float32)
    if r.shape != shape:
        raise AippMismatchError(f"the training preprocessing returns shape {r.shape} for {path}, AIPP gives "
                                f"{shape} (expected C,H,W)")
    return r


def verify(params: dict, paths: list[Path], channels: int, input_channel_order: str, reference, tolerance: float,
           norm_desc: str, check_plausible: bool) -> dict:
    """Compare AIPP on the device frames of ``paths`` with ``reference(image) -> CHW`` (module doc: what is
    compared for each input format, crop and padding)."""
    if not paths:
        raise AippMismatchError("no calibration images to verify the AIPP config with")
    a = spec(params)
    got, ref, orig = [], [], []
    for p in paths:
        img = read_image(p, channels)
        frame = device_frame(a, img, input_channel_order)
        got.append(apply(a, frame))
        ref.append(_reference(reference, seen_image(a, frame, img), got[-1].shape, p))
        if a.csc:
            orig.append(_reference(reference, img, got[-1].shape, p))
    got, ref = np.stack(got), np.stack(ref)
    if check_plausible:
        plausibility(ref, norm_desc)
    t, left, h, w = a.region(got.shape[2:])
    inner = (slice(None), slice(None), slice(t, t + h), slice(left, left + w))
    report = {"images": len(paths), "input_format": a.input_format, "tolerance": tolerance}
    bound = np.zeros(got.shape[1])
    if a.csc:
        standard, order = a.csc
        name, decoder = DECODERS[standard.name]
        levels = csc_error_bound(standard, decoder)
        levels = levels[::-1] if order == "BGR" else levels
        bound = levels * np.abs(np.array(a.var_reci, np.float64))
        o = np.abs(got[inner] - np.stack(orig)[inner])
        report["csc"] = {"standard": standard.name, "description": standard.label, "row_order": order,
                         "compared_with": f"the training preprocessing of each frame decoded to BGR by {name}",
                         "bound_levels": [float(v) for v in levels], "bound": [float(v) for v in bound],
                         "against_original": {"max_abs_diff": float(o.max()), "mean_abs_diff": float(o.mean()),
                                              "per_channel_max_abs_diff": [float(d) for d in o.max(axis=(0, 2, 3))]}}
    diff = np.abs(got[inner] - ref[inner])
    allowed = bound[None, :, None, None] + tolerance * np.maximum(1.0, np.abs(ref[inner]))
    ratio = diff / allowed
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    n, c, y, x = (int(v) for v in worst)
    y, x = y + t, x + left
    report.update({"max_abs_diff": float(diff.max()),
                   "per_channel_max_abs_diff": [float(d) for d in diff.max(axis=(0, 2, 3))],
                   "worst": {"image": str(paths[n]), "channel": c, "y": y, "x": x,
                             "aipp": float(got[n, c, y, x]), "training": float(ref[n, c, y, x])}})
    if a.crop:
        cx, cy, cw, ch = a.crop
        report["crop"] = {"frame": list(frame_geometry(a, got.shape[2:])[0][::-1]), "load_start_pos": [cx, cy],
                          "crop_size": [cw, ch]}
    if any(a.padding):
        border = np.ones(got.shape[2:], bool)
        border[t:t + h, left:left + w] = False
        report["padding"] = {"top_bottom_left_right": list(a.padding), "value": float(a.padding_value),
                             "pixels": int(border.sum()),
                             "training_border_mean_abs_diff": float(np.abs(ref[..., border] - a.padding_value).mean())}
    if ratio[worst] > 1.0:
        against = (f"{report['csc']['compared_with']}; allowed: the colour-conversion bound {bound[c]:.4f} plus the "
                   f"tolerance" if a.csc else "the training preprocessing of the image")
        raise AippMismatchError(
            f"AIPP config does not reproduce the training preprocessing: at {paths[n]} channel {c} pixel (y={y}, x={x}) "
            f"AIPP gives {got[n, c, y, x]:.6f} but training preprocessing gives {ref[n, c, y, x]:.6f} "
            f"(|diff| {diff[worst]:.6f} > allowed {allowed[worst]:.6f}; compared with {against}; largest |diff| per "
            f"channel: {', '.join(f'{d:.4f}' for d in report['per_channel_max_abs_diff'])}).\n"
            f"  AIPP:     {describe(params, got.shape[1])}\n"
            f"  training: {norm_desc}")
    return report


def norm_description(norm, input_channel_order: str, input_format: str = "RGB888_U8") -> str:
    ref = f", reference {norm.reference}" if norm.reference else ""
    frames = f"frames fed as {input_channel_order}" if input_format in ("RGB888_U8", "XRGB8888_U8") else \
        f"frames fed as {input_format}"
    return (f"mean={list(norm.mean)} std={list(norm.std)} scale={norm.scale} channel_order={norm.channel_order}, "
            f"{frames}{ref}")
