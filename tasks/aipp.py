"""aipp: the AIPP config rendered from ``aipp.template`` (by default the shipped template of ``aipp.input_format``),
the training normalization and the ``[aipp]`` frame settings (colour matrix, crop, padding) -- or the hand-written
``aipp.config_file`` -- read back from the written file and verified numerically against the training
preprocessing on the frames the device receives for calibration images (``quantflow.backends.aipp``)."""
from __future__ import annotations

import re
from pathlib import Path

from quantflow.backends.aipp import (Geometry, aipp_values, check_input_rank, default_format, norm_description, parse,
                                      raw_pixels, render, verify)
from quantflow.data.images import preprocess
from quantflow.engine.aipp import MAX_PADDED_WIDTH_310P, SUPPORTED_FORMATS
from quantflow.entry import load_entry
from quantflow.errors import AippMismatchError, ConfigError
from quantflow.io.atomic import write_json, write_text
from quantflow.io.digest import file_sha256

from .stage import Stage

AIPP_CFG, AIPP_CHECK = "aipp.cfg", "aipp_check.json"


def source_digest(cfg) -> str | None:
    """Hash of the AIPP source: the hand-written config file, or the template."""
    path = cfg.path(cfg.aipp.config_file) if cfg.aipp.config_file else cfg.aipp_template
    return file_sha256(path) if path.is_file() else None


def read_params(aipp_dir: Path) -> dict:
    """The verified AIPP config of an aipp stage folder, parsed."""
    path = Path(aipp_dir) / AIPP_CFG
    return parse(path.read_text(), str(path))


def template_format(cfg) -> str:
    """The input format the generated config is for: ``aipp.input_format``, else the one the template writes
    (else RGB888_U8 / YUV400_U8 by the model's channels)."""
    if cfg.aipp.input_format:
        return cfg.aipp.input_format
    path = cfg.aipp_template
    m = re.search(r"^\s*input_format\s*:\s*([A-Z0-9_]+)\s*$", path.read_text(), re.M) if path.is_file() else None
    return m.group(1) if m and m.group(1) in SUPPORTED_FORMATS else default_format(cfg.model.input_shape[1])


def geometry(cfg, input_format: str) -> Geometry:
    """The frame, crop and padding of ``[aipp]`` for the model input: the crop is the model input less the padding;
    the frame is ``aipp.src_image_size``, else the crop window's end.  Errors name the fields."""
    a = cfg.aipp
    _, _, h, w = cfg.model.input_shape
    pad = (a.padding.top, a.padding.bottom, a.padding.left, a.padding.right) if a.padding else (0, 0, 0, 0)
    rw, rh = w - pad[2] - pad[3], h - pad[0] - pad[1]
    if rw < 1 or rh < 1:
        raise ConfigError(f"aipp.padding {pad} (top, bottom, left, right) leaves nothing of the {w}x{h} model input")
    if a.crop_size is not None and tuple(a.crop_size) != (rw, rh):
        raise ConfigError(f"aipp.crop_size {list(a.crop_size)} plus aipp.padding must give the {w}x{h} model input "
                          f"(model.input_shape): the crop must be [{rw}, {rh}]")
    x, y = a.load_start_pos or (0, 0)
    src = tuple(a.src_image_size or (x + rw, y + rh))
    if x + rw > src[0] or y + rh > src[1]:
        raise ConfigError(f"aipp.load_start_pos [{x}, {y}] + the {rw}x{rh} crop exceeds aipp.src_image_size "
                          f"{list(src)}")
    crop = (x, y, rw, rh) if src != (rw, rh) else None
    if input_format == "YUV420SP_U8":
        odd = [f"{name} {list(v)}" for name, v in (("frame (aipp.src_image_size)", src), ("aipp.load_start_pos", (x, y)),
                                                   ("crop (model input less aipp.padding)", (rw, rh)))
               if any(d % 2 for d in v)]
        if odd:
            raise ConfigError(f"aipp.input_format YUV420SP_U8: {', '.join(odd)} must be even (4:2:0 chroma blocks)")
    if any(pad) and cfg.build.soc_version.startswith("Ascend310P") and w > MAX_PADDED_WIDTH_310P:
        raise ConfigError(f"aipp.padding: the padded output is {w} wide; {cfg.build.soc_version} pads outputs up to "
                          f"{MAX_PADDED_WIDTH_310P} wide only (TBE aipp_comm.py)")
    return Geometry(src, crop, pad, a.padding_value)


def _check_rendered(cfg, params: dict, fmt: str, g: Geometry, origin: str) -> None:
    """A template must write what ``[aipp]`` asks for."""
    if params.get("input_format") != fmt:
        raise ConfigError(f"aipp.template {origin} writes input_format {params.get('input_format')}, but "
                          f"aipp.input_format is {fmt}")
    for key, wanted, placeholder in (("crop", g.crop is not None, "${crop}"), ("padding", any(g.padding), "${padding}")):
        if wanted and params.get(key, "false").lower() not in ("true", "1"):
            raise ConfigError(f"aipp.template {origin} does not write the {key} that [aipp] asks for (put "
                              f"{placeholder} in the aipp_op block, as the shipped templates do)")


def build_and_verify(cfg, image_paths: list[Path], out_cfg: Path) -> dict:
    """Write the AIPP config (generated, or the configured hand-written one) to ``out_cfg`` and verify it."""
    norm, a = cfg.normalization, cfg.aipp
    channels = cfg.model.input_shape[1]
    if a.config_file is not None:
        src = cfg.path(a.config_file)
        if not src.is_file():
            raise ConfigError(f"aipp.config_file: file not found: {src}")
        text, origin = src.read_text(), str(src)
    else:
        fmt = template_format(cfg)
        g = geometry(cfg, fmt)
        values = aipp_values(cfg.model.input_shape, norm.mean, norm.std, norm.scale, norm.channel_order,
                             a.input_channel_order, input_format=fmt, color_matrix=a.color_matrix, geometry=g)
        text, origin = render(cfg.aipp_template, values), str(cfg.aipp_template)
    out_cfg = Path(out_cfg)
    out_cfg.parent.mkdir(parents=True, exist_ok=True)
    write_text(out_cfg, text)
    # errors in a hand-written config name the user's file, not the copy
    params = parse(out_cfg.read_text(), origin if a.config_file is not None else str(out_cfg))
    check_input_rank(params, origin)
    if a.config_file is None:
        _check_rendered(cfg, params, fmt, g, origin)
    elif a.input_format and params.get("input_format") != a.input_format:
        raise ConfigError(f"aipp.config_file {origin} is for input_format {params.get('input_format')}, but "
                          f"aipp.input_format is {a.input_format}")
    fmt_channels = SUPPORTED_FORMATS.get(params.get("input_format"))
    if fmt_channels is not None and fmt_channels != channels:
        raise AippMismatchError(f"{origin}: input_format {params.get('input_format')} gives {fmt_channels} channel(s), "
                                f"the model input has {channels}")
    if norm.reference:
        reference = load_entry(norm.reference, "normalization.reference")
    else:
        def reference(img):
            return preprocess(img[None], norm.mean, norm.std, norm.scale, norm.channel_order)[0]
    raw = raw_pixels(norm.std, norm.scale)
    try:
        report = verify(params, image_paths[: a.verify_images], channels, a.input_channel_order, reference,
                        a.tolerance, norm_description(norm, a.input_channel_order, params.get("input_format")),
                        check_plausible=not norm.reference and not raw)
    except AippMismatchError as err:
        raise AippMismatchError(f"{origin}: {err}") from None
    if raw and not norm.reference:
        less = f" less mean {list(norm.mean)}" if any(norm.mean) else ""
        report["note"] = f"as declared, the network takes raw pixel values (0..255{less}; std 1, scale \"0-255\")"
    report["source"] = origin
    report["params"] = params
    return report


def _run(b) -> None:
    kdir = b.dir("aipp")
    report = build_and_verify(b.cfg, b.calibration_paths(), kdir / AIPP_CFG)
    write_json(kdir / AIPP_CHECK, report)
    csc = report.get("csc")
    how = (f", {csc['standard']} {csc['row_order']}: within the colour-conversion bound of the frames decoded by "
           f"{csc['compared_with'].rsplit(' by ', 1)[-1]}; against the original images largest |diff| "
           f"{csc['against_original']['max_abs_diff']:.2e}" if csc else "")
    print(f"AIPP config {kdir / AIPP_CFG} ({report['input_format']}) verified on {report['images']} calibration "
          f"images (largest |diff| {report['max_abs_diff']:.2e}, tolerance {report['tolerance']}{how})")
    if "note" in report:
        print(f"note: {report['note']}")


def _key_inputs(b) -> dict:
    c = b.cfg.model_dump(mode="json")
    return {"aipp": c["aipp"], "normalization": c["normalization"], "manifest": b.manifest_digest(),
            "input_shape": c["model"]["input_shape"], "aipp_source": source_digest(b.cfg),
            "soc_version": b.cfg.build.soc_version}


STAGE = Stage(
    name="aipp", doc="AIPP config from the training normalization, verified on calibration images", run=_run,
    needs=("sample",), key_inputs=_key_inputs, outputs=(AIPP_CFG, AIPP_CHECK),
    summary=lambda b: {"aipp_config": str(b.dir("aipp") / AIPP_CFG)})
