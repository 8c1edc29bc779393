import tomllib
from pathlib import Path

import cv2
import numpy as np
import pytest
from quantflow.tasks.aipp import build_and_verify

from quantflow import aipp_templates
from quantflow.backends import aipp
from quantflow.config import config_from_dict
from quantflow.data.images import scan_class_folders
from quantflow.engine.aipp import apply
from quantflow.errors import AippMismatchError, ConfigError

REPO = Path(__file__).resolve().parents[1]
CALIB = [i.path for i in scan_class_folders(REPO / "calib_data")][::10]


def cfg_with(**sections):
    d = tomllib.loads((REPO / "quantflow.toml").read_text())
    for sec, values in sections.items():
        d[sec].update(values)
    return config_from_dict(d, root=REPO)


def test_generated_config_reproduces_the_demo_training_preprocessing(tmp_path):
    report = build_and_verify(cfg_with(), CALIB, tmp_path / "aipp.cfg")
    assert report["images"] == len(CALIB[:32])
    assert report["max_abs_diff"] < 5e-3
    params = aipp.parse((tmp_path / "aipp.cfg").read_text())
    assert params["input_format"] == "RGB888_U8"
    assert params["rbuv_swap_switch"] == "true"  # frames arrive BGR, the network was trained on RGB
    assert params["src_image_size_w"] == "32" and params["src_image_size_h"] == "32"
    # mean split into the integer mean_chn and the fractional min_chn, in the 0-255 domain
    assert int(params["mean_chn_0"]) + float(params["min_chn_0"]) == pytest.approx(0.471 * 255, abs=1e-5)
    assert float(params["var_reci_chn_0"]) == pytest.approx(1 / (0.257 * 255), rel=1e-7)


def test_mean_in_the_wrong_domain_fails_showing_both_values(tmp_path):
    # mean/std written for 0-1 pixels, declared as 0-255: the AIPP subtracts 0.47 from 0-255 pixels
    cfg = cfg_with(normalization={"scale": "0-255"})
    with pytest.raises(AippMismatchError) as e:
        build_and_verify(cfg, CALIB, tmp_path / "aipp.cfg")
    msg = str(e.value)
    assert "does not reproduce the training preprocessing" in msg
    assert "AIPP gives" in msg and "training preprocessing gives" in msg
    assert "chn_0: mean=0 min=0.471000" in msg  # the AIPP values, next to the training declaration
    assert "scale=0-255" in msg


def test_wrong_std_fails(tmp_path):
    with pytest.raises(AippMismatchError, match="does not reproduce"):
        build_and_verify(cfg_with(normalization={"std": [0.5, 0.5, 0.5]}), CALIB, tmp_path / "a.cfg")


def test_wrong_channel_order_fails(tmp_path):
    # the device will be fed RGB frames but the config says BGR: no swap is generated
    with pytest.raises(AippMismatchError, match="does not reproduce"):
        build_and_verify(cfg_with(aipp={"input_channel_order": "RGB"}, normalization={"channel_order": "BGR"}),
                              CALIB, tmp_path / "a.cfg")


def test_wrong_domain_caught_without_a_reference(tmp_path):
    cfg = cfg_with(normalization={"scale": "0-255", "reference": None})
    with pytest.raises(AippMismatchError, match="0-1 domain with scale = \"0-255\""):
        build_and_verify(cfg, CALIB, tmp_path / "a.cfg")
    # and the correct declaration passes against quantflow's own reference preprocessing
    assert build_and_verify(cfg_with(normalization={"reference": None}), CALIB, tmp_path / "b.cfg")["images"]


def test_hand_written_config_is_verified(tmp_path):
    good = tmp_path / "good.cfg"
    good.write_text(aipp.render(aipp_templates.path("static_rgb888_u8.cfg"),
                                aipp.aipp_values((1, 3, 32, 32), (0.471, 0.463, 0.467), (0.257, 0.26, 0.26), "0-1",
                                                 "RGB", "BGR")))
    assert build_and_verify(cfg_with(aipp={"config_file": str(good)}), CALIB, tmp_path / "o1.cfg")["images"]
    bad = tmp_path / "bad.cfg"
    bad.write_text(good.read_text().replace("var_reci_chn_1 : 0.0150829563", "var_reci_chn_1 : 0.0039215686"))
    with pytest.raises(AippMismatchError, match="channel 1"):
        build_and_verify(cfg_with(aipp={"config_file": str(bad)}), CALIB, tmp_path / "o2.cfg")


def test_grayscale_template(tmp_path):
    img_dir = tmp_path / "g" / "0"
    img_dir.mkdir(parents=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(4):
        p = img_dir / f"{i}.png"
        cv2.imwrite(str(p), rng.integers(0, 256, (16, 16), dtype=np.uint8))
        paths.append(p)
    values = aipp.aipp_values((1, 1, 16, 16), (0.5,), (0.25,), "0-1", "GRAY", "GRAY")
    params = aipp.parse(aipp.render(aipp_templates.path("static_yuv400_u8.cfg"), values))
    ref = lambda img: ((img.astype(np.float32) / 255 - 0.5) / 0.25)[None]  # noqa: E731
    report = aipp.verify(params, paths, 1, "GRAY", ref, 5e-3, "gray", check_plausible=True)
    assert report["max_abs_diff"] < 5e-3


def test_parse_errors():
    with pytest.raises(AippMismatchError, match="expected one aipp_op block, found 0"):
        aipp.parse("# nothing\n")
    with pytest.raises(AippMismatchError, match="not closed"):
        aipp.parse("aipp_op {\n input_format : RGB888_U8\n")
    with pytest.raises(AippMismatchError, match="given twice"):
        aipp.parse("aipp_op {\n a : 1\n a : 2\n}\n")
    with pytest.raises(AippMismatchError, match="cannot parse"):
        aipp.parse("aipp_op {\n input_format = RGB888_U8\n}\n")


def test_unverifiable_features_are_refused():
    frame = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(AippMismatchError, match="YUV420SP_U8"):
        apply({"input_format": "YUV420SP_U8"}, frame)
    with pytest.raises(AippMismatchError, match="csc_switch"):
        apply({"input_format": "RGB888_U8", "csc_switch": "true"}, frame)
    with pytest.raises(AippMismatchError, match="src_image_size 8x8"):
        apply({"input_format": "RGB888_U8", "src_image_size_w": "8", "src_image_size_h": "8"}, frame)


def test_template_placeholder_errors(tmp_path):
    t = tmp_path / "t.cfg"
    t.write_text("aipp_op {\n mean_chn_7 : ${mean_chn_7}\n}\n")
    with pytest.raises(ConfigError, match=r"\$\{mean_chn_7\} has no value"):
        aipp.render(t, {"mean_chn_0": "1"})
    with pytest.raises(ConfigError, match="not found"):
        aipp.render(tmp_path / "missing.cfg", {})
