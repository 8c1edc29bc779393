"""A catalogue of bad inputs through `doit`: each fails with a message naming what is wrong, no traceback."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.project import run_doit

from quantflow import aipp_templates


def _toml_syntax(p: Path) -> str:
    (p / "quantflow.toml").write_text((p / "quantflow.toml").read_text().replace("[model]", "[model"))
    return "is not valid TOML"


def _empty_calibration(p: Path) -> str:
    shutil.rmtree(p / "calib_data")
    (p / "calib_data").mkdir()
    return "holds no per-class sub-folders"


def _symlink_loop(p: Path) -> str:
    os.symlink(p / "calib_data", p / "calib_data" / "loop")
    return "class folder(s) outside the model's 10 classes: loop"


def _not_an_image(p: Path) -> str:
    bad = sorted((p / "calib_data" / "0").iterdir())[0]
    bad.write_bytes(b"this is not a PNG file")
    return f"unreadable image (OpenCV could not decode it): {bad}"


def _unreadable_checkpoint(p: Path) -> str:
    toml = p / "quantflow.toml"
    text = toml.read_text().replace('checkpoint = "build/demo/digits.ckpt"', 'checkpoint = "garbage.ckpt"')
    toml.write_text(text[:text.index("[train]")])
    (p / "garbage.ckpt").write_bytes(b"\x00" * 100)
    return "model.checkpoint: cannot read"


def _truncated_mindir(p: Path) -> str:
    from quantflow.backends.export import export_mindir
    from quantflow.demo.net import build

    path = export_mindir(build(10), (1, 3, 32, 32), p / "net.mindir")
    path.write_bytes(path.read_bytes()[:2000])
    toml = p / "quantflow.toml"
    text = toml.read_text().replace('entry = "quantflow.demo.net:build"\ncheckpoint = "build/demo/digits.ckpt"',
                                    'mindir = "net.mindir"')
    toml.write_text(text[:text.index("[train]")])
    return "net.mindir is not a readable MindIR file"


def _aipp_missing_brace(p: Path) -> str:
    (p / "my_aipp.cfg").write_text("aipp_op {\n  aipp_mode : static\n  input_format : RGB888_U8\n")
    toml = p / "quantflow.toml"
    toml.write_text(toml.read_text().replace('input_channel_order = "BGR"',
                                             'input_channel_order = "BGR"\nconfig_file = "my_aipp.cfg"'))
    return "my_aipp.cfg: aipp_op block not closed"


def _aipp_out_of_range(p: Path) -> str:
    from quantflow.backends.aipp import aipp_values, render

    values = aipp_values((1, 3, 32, 32), [0.471, 0.463, 0.467], [0.257, 0.26, 0.26], "0-1", "RGB", "BGR")
    text = render(aipp_templates.path("static_rgb888_u8.cfg"), {**values, "mean_chn_0": "300"})
    (p / "my_aipp.cfg").write_text(text)
    toml = p / "quantflow.toml"
    toml.write_text(toml.read_text().replace('input_channel_order = "BGR"',
                                             'input_channel_order = "BGR"\nconfig_file = "my_aipp.cfg"'))
    return "AIPP mean_chn_0: must be an integer in [0, 255] (a uint8 on the device), got 300"


CASES = [_toml_syntax, _empty_calibration, _symlink_loop, _not_an_image, _unreadable_checkpoint, _truncated_mindir,
         _aipp_missing_brace, _aipp_out_of_range]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.strip("_") for c in CASES])
def test_bad_input_fails_by_name_without_a_traceback(built_demo, tmp_path, case):
    project, _ = built_demo
    p = tmp_path / "p"
    shutil.copytree(project, p, ignore=shutil.ignore_patterns("artifacts", ".doit.db*", ".doit.sqlite*", "__pycache__", "*.toml.*"),
                    symlinks=True)
    expected = case(p)
    proc = run_doit(p)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    assert expected in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
