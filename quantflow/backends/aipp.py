"""The AIPP configuration file (CANN ``aipp_op`` format): generated from the training normalization, read back,
and verified numerically.

The config is rendered from a template (quantflow ships some: ``quantflow.aipp_templates``), then **read back
from the written file** and applied as the device computes it (``quantflow.engine.aipp``) to real calibration
images, fed in the channel order the device will receive them.  The result must match the training
preprocessing -- the ``normalization.reference`` callable when configured, otherwise the declared mean/std --
within the tolerance, or the build fails showing both values.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from string import Template

import numpy as np

from .. import aipp_templates
from ..data.images import read_image
from ..engine.aipp import apply, device_frame
from ..errors import AippMismatchError, ConfigError

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


def describe(params: dict, channels: int) -> str:
    parts = [f"rbuv_swap_switch={params.get('rbuv_swap_switch', 'false')}"] if channels == 3 else []
    for i in range(channels):
        parts.append(f"chn_{i}: mean={params.get(f'mean_chn_{i}', '0')} min={params.get(f'min_chn_{i}', '0')} "
                     f"var_reci={params.get(f'var_reci_chn_{i}', '1')}")
    return "; ".join(parts)


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
