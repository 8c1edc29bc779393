"""Stage 4: AIPP configuration from the training normalization, verified numerically.

The config is rendered from a template (CANN ``aipp_op`` format; quantflow ships two in quantflow/aipp_templates/), then
**read back from the written file** and its formula

    out_chn_i = (pixel_chn_i - mean_chn_i - min_chn_i) * var_reci_chn_i

(after the R/B swap when ``rbuv_swap_switch`` is true, with min/var_reci and the output in
float16 as on the device) is applied to real calibration images, fed in the channel order
the device will receive them.  The result must match the training preprocessing -- the
``normalization.reference`` callable when configured, otherwise the declared mean/std --
within the tolerance, or the build fails showing both values.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from string import Template

import numpy as np

from ..errors import AippMismatchError, ConfigError
from ..images import preprocess, read_image
from ..pipeline.atomic import write_text

SUPPORTED_FORMATS = {"RGB888_U8": 3, "YUV400_U8": 1}
_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(\S+)\s*$")


# ----------------------------------------------------------------------------- generation

def aipp_values(input_shape, mean, std, scale: str, channel_order: str, input_channel_order: str) -> dict:
    """Template values reproducing ((pixel [/255]) - mean) / std."""
    _, c, h, w = input_shape
    k = 255.0 if scale == "0-1" else 1.0
    values = {"src_image_size_w": str(w), "src_image_size_h": str(h),
              "rbuv_swap_switch": "true" if (c == 3 and input_channel_order != channel_order) else "false"}
    for i, (m, s) in enumerate(zip(mean, std)):
        m255 = m * k
        base = math.floor(m255) if m255 >= 0 else 0
        base = int(min(max(base, 0), 255))
        values[f"mean_chn_{i}"] = str(base)
        values[f"min_chn_{i}"] = f"{m255 - base:.6f}"
        values[f"var_reci_chn_{i}"] = f"{1.0 / (s * k):.9g}"
    return values


def render(template_path: Path, values: dict) -> str:
    template_path = Path(template_path)
    if not template_path.is_file():
        from ..config import PACKAGED_AIPP_TEMPLATES
        shipped = ", ".join(sorted(p.name for p in PACKAGED_AIPP_TEMPLATES.glob("*.cfg")))
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
    blocks, current, depth = [], None, 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if re.fullmatch(r"aipp_op\s*\{", line):
            if current is not None:
                raise AippMismatchError(f"{source}:{lineno}: nested aipp_op block")
            current, depth = {}, 1
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


def describe(params: dict, channels: int) -> str:
    parts = [f"rbuv_swap_switch={params.get('rbuv_swap_switch', 'false')}"] if channels == 3 else []
    for i in range(channels):
        parts.append(f"chn_{i}: mean={params.get(f'mean_chn_{i}', '0')} min={params.get(f'min_chn_{i}', '0')} "
                     f"var_reci={params.get(f'var_reci_chn_{i}', '1')}")
    return "; ".join(parts)


# ----------------------------------------------------------------------------- verification

def device_frame(bgr_or_gray: np.ndarray, input_channel_order: str) -> np.ndarray:
    """The raw frame the device receives, from an image as OpenCV read it."""
    if input_channel_order == "RGB":
        return np.ascontiguousarray(bgr_or_gray[..., ::-1])
    return bgr_or_gray


def plausibility(ref: np.ndarray, norm_desc: str) -> None:
    """Catch a normalization in the wrong pixel domain when there is no reference to compare to."""
    axes = (0, 2, 3)
    mean, std = ref.mean(axis=axes), ref.std(axis=axes)
    for i, (m, s) in enumerate(zip(mean, std)):
        if abs(m) > 10.0 or s > 20.0 or s < 1e-2:
            raise AippMismatchError(
                f"the declared normalization ({norm_desc}) turns the calibration images into channel {i} "
                f"values of mean {m:.3f} and std {s:.3f}, far from the ~0 / ~1 a training normalization gives: "
                f"are mean/std given in the 0-1 domain with scale = \"0-255\" (or the reverse)?")


def verify(params: dict, paths: list[Path], channels: int, input_channel_order: str, reference, tolerance: float,
           norm_desc: str, check_plausible: bool) -> dict:
    """Compare AIPP on the device frames of ``paths`` with ``reference(image) -> CHW``."""
    if not paths:
        raise AippMismatchError("no calibration images to verify the AIPP config with")
    got, ref = [], []
    for p in paths:
        img = read_image(p, channels)
        got.append(apply(params, device_frame(img, input_channel_order)))
        r = np.asarray(reference(img), np.float32)
        if r.shape != got[-1].shape:
            raise AippMismatchError(f"the training preprocessing returns shape {r.shape} for {p}, AIPP gives "
                                    f"{got[-1].shape} (expected C,H,W)")
        ref.append(r)
    got, ref = np.stack(got), np.stack(ref)
    if check_plausible:
        plausibility(ref, norm_desc)
    diff = np.abs(got - ref)
    allowed = tolerance * np.maximum(1.0, np.abs(ref))
    ratio = diff / allowed
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    n, c, y, x = (int(v) for v in worst)
    report = {"images": len(paths), "max_abs_diff": float(diff.max()), "tolerance": tolerance,
              "per_channel_max_abs_diff": [float(d) for d in diff.max(axis=(0, 2, 3))],
              "worst": {"image": str(paths[n]), "channel": c, "y": y, "x": x,
                        "aipp": float(got[worst]), "training": float(ref[worst])}}
    if ratio[worst] > 1.0:
        raise AippMismatchError(
            f"AIPP config does not reproduce the training preprocessing: at {paths[n]} channel {c} pixel (y={y}, x={x}) "
            f"AIPP gives {got[worst]:.6f} but training preprocessing gives {ref[worst]:.6f} "
            f"(|diff| {diff[worst]:.6f} > allowed {allowed[worst]:.6f}; largest |diff| per channel: "
            f"{', '.join(f'{d:.4f}' for d in report['per_channel_max_abs_diff'])}).\n"
            f"  AIPP:     {describe(params, got.shape[1])}\n"
            f"  training: {norm_desc}")
    return report


def norm_description(norm, input_channel_order: str) -> str:
    ref = f", reference {norm.reference}" if norm.reference else ""
    return (f"mean={list(norm.mean)} std={list(norm.std)} scale={norm.scale} channel_order={norm.channel_order}, "
            f"frames fed as {input_channel_order}{ref}")


def build_and_verify(cfg, image_paths: list[Path], out_cfg: Path) -> dict:
    """Write the AIPP config (generated, or the configured hand-written one) to ``out_cfg`` and verify it."""
    from ..model import load_entry

    norm, a = cfg.normalization, cfg.aipp
    channels = cfg.model.input_shape[1]
    if a.config_file is not None:
        src = cfg.path(a.config_file)
        if not src.is_file():
            raise ConfigError(f"aipp.config_file: file not found: {src}")
        text, origin = src.read_text(), str(src)
    else:
        values = aipp_values(cfg.model.input_shape, norm.mean, norm.std, norm.scale, norm.channel_order,
                             a.input_channel_order)
        text, origin = render(cfg.aipp_template, values), str(cfg.aipp_template)
    out_cfg = Path(out_cfg)
    out_cfg.parent.mkdir(parents=True, exist_ok=True)
    write_text(out_cfg, text)
    # errors in a hand-written config name the user's file, not the copy
    params = parse(out_cfg.read_text(), origin if a.config_file is not None else str(out_cfg))
    fmt_channels = SUPPORTED_FORMATS.get(params.get("input_format"))
    if fmt_channels is not None and fmt_channels != channels:
        raise AippMismatchError(f"{origin}: input_format {params.get('input_format')} has {fmt_channels} channel(s), "
                                f"the model input has {channels}")
    if norm.reference:
        reference = load_entry(norm.reference, "normalization.reference")
    else:
        def reference(img):
            return preprocess(img[None], norm.mean, norm.std, norm.scale, norm.channel_order)[0]
    report = verify(params, image_paths[: a.verify_images], channels, a.input_channel_order, reference, a.tolerance,
                    norm_description(norm, a.input_channel_order), check_plausible=not norm.reference)
    report["source"] = origin
    report["params"] = params
    return report
