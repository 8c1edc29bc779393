"""aipp: the AIPP config rendered from ``aipp.template`` and the training normalization (or the hand-written
``aipp.config_file``), read back from the written file and verified numerically against the training
preprocessing on calibration images (``quantflow.backends.aipp``)."""
from __future__ import annotations

from pathlib import Path

from quantflow.backends.aipp import aipp_values, norm_description, parse, raw_pixels, render, verify
from quantflow.data.images import preprocess
from quantflow.engine.aipp import SUPPORTED_FORMATS
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
    raw = raw_pixels(norm.std, norm.scale)
    report = verify(params, image_paths[: a.verify_images], channels, a.input_channel_order, reference, a.tolerance,
                    norm_description(norm, a.input_channel_order), check_plausible=not norm.reference and not raw)
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
    print(f"AIPP config {kdir / AIPP_CFG} verified on {report['images']} calibration images "
          f"(largest |diff| {report['max_abs_diff']:.2e}, tolerance {report['tolerance']})")
    if "note" in report:
        print(f"note: {report['note']}")


def _key_inputs(b) -> dict:
    c = b.cfg.model_dump(mode="json")
    return {"aipp": c["aipp"], "normalization": c["normalization"], "manifest": b.manifest_digest(),
            "input_shape": c["model"]["input_shape"], "aipp_source": source_digest(b.cfg)}


STAGE = Stage(
    name="aipp", doc="AIPP config from the training normalization, verified on calibration images", run=_run,
    needs=("sample",), key_inputs=_key_inputs, outputs=(AIPP_CFG, AIPP_CHECK),
    summary=lambda b: {"aipp_config": str(b.dir("aipp") / AIPP_CFG)})
