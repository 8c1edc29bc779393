"""The AIPP config: generation, parsing, the check against the training preprocessing, and the device arithmetic
(swap, crop, CSC for each documented matrix, DTC, padding) against an independent NumPy statement of CANN's
documentation (tests/support/aipp_reference.py, which imports nothing from quantflow)."""
import re
import tomllib
from pathlib import Path

import cv2
import numpy as np
import pytest
from quantflow.tasks.aipp import build_and_verify, geometry
from support import aipp_reference as doc

from quantflow import aipp_templates
from quantflow.backends import aipp
from quantflow.config import config_from_dict
from quantflow.data.images import read_image, scan_class_folders
from quantflow.engine import aipp as device
from quantflow.engine.aipp import STANDARDS, apply, csc, csc_error_bound, device_frame, encode_yuv420
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
    assert report["images"] == len(CALIB[:8])   # aipp.verify_images
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
    nv12 = np.zeros((6, 4), np.uint8)
    yuv = {"input_format": "YUV420SP_U8", "csc_switch": "true",
           **{f"matrix_r{r}c{c}": str(v) for r, row in enumerate(doc.MATRICES["bt601_narrow"][0]) for c, v in enumerate(row)},
           **{f"input_bias_{i}": str(b) for i, b in enumerate(doc.MATRICES["bt601_narrow"][1])}}
    assert apply(yuv, nv12).shape == (3, 4, 4)
    with pytest.raises(AippMismatchError, match="YUV444"):
        apply({"input_format": "YUV420SP_U8"}, nv12)
    with pytest.raises(AippMismatchError, match="NV21"):
        apply({**yuv, "rbuv_swap_switch": "true"}, nv12)
    with pytest.raises(AippMismatchError, match="none of the documented"):
        apply({**yuv, "matrix_r0c0": "297"}, nv12)
    with pytest.raises(AippMismatchError, match="write matrix_r0c0"):
        apply({k: v for k, v in yuv.items() if k != "matrix_r1c1"}, nv12)
    with pytest.raises(AippMismatchError, match="matrix_r0c1: must be in"):
        apply({**yuv, "matrix_r0c1": "40000"}, nv12)
    with pytest.raises(AippMismatchError, match="load_start_pos_w 1 must be even"):
        apply({**yuv, "crop": "true", "load_start_pos_w": "1", "crop_size_w": "2", "crop_size_h": "2"}, nv12)
    with pytest.raises(AippMismatchError, match="csc_switch"):
        apply({"input_format": "RGB888_U8", "csc_switch": "true"}, frame)
    with pytest.raises(AippMismatchError, match="resize"):
        apply({"input_format": "RGB888_U8", "resize": "true"}, frame)
    with pytest.raises(AippMismatchError, match="src_image_size 8x8"):
        apply({"input_format": "RGB888_U8", "src_image_size_w": "8", "src_image_size_h": "8"}, frame)
    with pytest.raises(AippMismatchError, match="exceeds src_image_size_w"):
        apply({"input_format": "RGB888_U8", "src_image_size_w": "4", "crop": "true", "load_start_pos_w": "2",
               "crop_size_w": "3", "crop_size_h": "2"}, frame)
    with pytest.raises(AippMismatchError, match="top_padding_size: must be in \\[0, 32\\]"):
        apply({"input_format": "RGB888_U8", "padding": "true", "top_padding_size": "33"}, frame)
    with pytest.raises(AippMismatchError, match="padding_value: must be a finite float16"):
        apply({"input_format": "RGB888_U8", "padding": "true", "padding_value": "1e6"}, frame)


def test_template_placeholder_errors(tmp_path):
    t = tmp_path / "t.cfg"
    t.write_text("aipp_op {\n mean_chn_7 : ${mean_chn_7}\n}\n")
    with pytest.raises(ConfigError, match=r"\$\{mean_chn_7\} has no value"):
        aipp.render(t, {"mean_chn_0": "1"})
    with pytest.raises(ConfigError, match="not found"):
        aipp.render(tmp_path / "missing.cfg", {})


# ----------------------------------------------------------------------------- the device arithmetic, per feature

MEAN, STD = (0.471, 0.463, 0.467), (0.257, 0.26, 0.26)


def rendered(fmt, channel_order="RGB", frame_order="BGR", matrix=None, geom=None, shape=(1, 3, 32, 32)):
    """(params as quantflow parses them, the same text as the independent statement reads it)."""
    c = shape[1]
    values = aipp.aipp_values(shape, MEAN[:c] if c == 3 else (0.5,), STD[:c] if c == 3 else (0.25,), "0-1",
                              channel_order, frame_order, input_format=fmt, color_matrix=matrix, geometry=geom)
    text = aipp.render(aipp_templates.path(f"static_{fmt.lower()}.cfg"), values)
    return aipp.parse(text), doc.read_config(text)


def random_image(h=32, w=32, seed=0, gray=False):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (h, w) if gray else (h, w, 3), dtype=np.uint8)


def yuv_cube():
    """Every Y, and U, V in steps of 3 with both ends: H, W, 3 uint8 (sums below 0 and above 255 << 8 included)."""
    uv = np.r_[np.arange(0, 256, 3), 255]
    y, u, v = np.meshgrid(np.arange(256), uv, uv, indexing="ij")
    return np.stack([y, u, v], axis=-1).reshape(256, -1, 3).astype(np.uint8)


@pytest.mark.parametrize("order", ["RGB", "BGR"])
@pytest.mark.parametrize("standard", list(STANDARDS))
def test_each_csc_matrix_equals_the_documented_integer_arithmetic(standard, order):
    matrix, bias = doc.MATRICES[standard]
    rows = matrix if order == "RGB" else matrix[::-1]  # BGR output: rows 0 and 2 swapped
    s = STANDARDS[standard]
    assert s.matrix(order).tolist() == [list(r) for r in rows] and s.input_bias == bias
    yuv = yuv_cube()
    got = csc(yuv, s.matrix(order), s.input_bias)
    want = doc.csc_planes(rows, bias, yuv[..., 0], yuv[..., 1], yuv[..., 2])
    np.testing.assert_array_equal(got, want)
    # the floor below zero and the saturation are exercised, pixel by pixel too
    for y, u, v in ((16, 128, 0), (0, 255, 255), (255, 0, 0), (17, 129, 127), (235, 240, 16)):
        assert csc(np.array([[[y, u, v]]], np.uint8), s.matrix(order), s.input_bias)[0, 0].tolist() == \
            doc.csc_pixel(rows, bias, y, u, v)


def test_bgr_output_writes_the_documented_bgr_sample_matrix():
    """ATC's YUV420SP_U8 -> BGR sample (atlasatc_16_0028): r0 = 298 516 0, r2 = 298 0 409, bias 16 128 128."""
    params, _ = rendered("YUV420SP_U8", channel_order="BGR")
    assert [params[f"matrix_r0c{c}"] for c in range(3)] == ["298", "516", "0"]
    assert [params[f"matrix_r1c{c}"] for c in range(3)] == ["298", "-100", "-208"]
    assert [params[f"matrix_r2c{c}"] for c in range(3)] == ["298", "0", "409"]
    assert [params[f"input_bias_{i}"] for i in range(3)] == ["16", "128", "128"]
    assert params["csc_switch"] == "true" and params["rbuv_swap_switch"] == "false"


@pytest.mark.parametrize("order", ["RGB", "BGR"])
@pytest.mark.parametrize("standard", list(STANDARDS))
def test_yuv420sp_frames_through_aipp_equal_the_independent_statement(standard, order):
    params, cfg = rendered("YUV420SP_U8", channel_order=order, matrix=standard)
    for seed in range(3):
        frame = device_frame(params, random_image(seed=seed), "BGR")
        assert frame.shape == (48, 32) and frame.dtype == np.uint8
        np.testing.assert_array_equal(apply(params, frame), doc.aipp(cfg, frame).astype(np.float32))


def test_bt601_narrow_frames_are_opencvs_i420_as_nv12():
    img = random_image(seed=4)
    i420 = cv2.cvtColor(img, cv2.COLOR_BGR2YUV_I420)
    y, u, v = i420[:32], i420[32:40].reshape(16, 16), i420[40:].reshape(16, 16)
    params, _ = rendered("YUV420SP_U8")
    frame = device_frame(params, img, "BGR")
    np.testing.assert_array_equal(frame[:32], y)
    for r in range(16):
        for c in range(16):
            assert frame[32 + r, 2 * c] == u[r, c] and frame[32 + r, 2 * c + 1] == v[r, c]


@pytest.mark.parametrize("standard", ["bt601_full", "bt709_narrow"])
def test_other_standards_encode_by_their_defining_formulas(standard):
    """Y = Kr R + Kg G + Kb B, U and V from B - Y and R - Y (ITU-R BT.601 / BT.709; JPEG full range), chroma taken at
    each 2x2 block's top-left pixel; OpenCV's fixed point and this rounding differ by at most one level."""
    kr, kb = {"bt601_full": (0.299, 0.114), "bt709_narrow": (0.2126, 0.0722)}[standard]
    img = random_image(seed=5)
    r, g, b = (img[..., i].astype(np.float64) for i in (2, 1, 0))
    luma = kr * r + (1 - kr - kb) * g + kb * b
    cb, cr = (b - luma) / (2 * (1 - kb)), (r - luma) / (2 * (1 - kr))
    if standard == "bt709_narrow":
        luma, cb, cr = 16 + luma * 219 / 255, 128 + cb * 224 / 255, 128 + cr * 224 / 255
    else:
        cb, cr = cb + 128, cr + 128
    y, u, v = encode_yuv420(img, STANDARDS[standard])
    assert np.abs(y - np.clip(np.round(luma), 0, 255)).max() <= 1
    assert np.abs(u - np.clip(np.round(cb[::2, ::2]), 0, 255)).max() <= 1
    assert np.abs(v - np.clip(np.round(cr[::2, ::2]), 0, 255)).max() <= 1


@pytest.mark.parametrize("standard", list(STANDARDS))
def test_the_colour_conversion_bound_holds_against_each_reference_decoder(standard):
    """Over YUV values a frame of the standard holds (narrow: Y 16..235, U, V 16..240), AIPP's integer CSC is
    within ``csc_error_bound`` of the reference decoder the check compares through (OpenCV's for BT.601)."""
    s = STANDARDS[standard]
    lo_y, hi_y, lo_c, hi_c = (0, 255, 0, 255) if s.full_range else (16, 235, 16, 240)
    uv = np.r_[np.arange(lo_c, hi_c + 1, 2), hi_c]
    u, v = np.meshgrid(uv, uv, indexing="ij")
    u, v = u.ravel(), v.ravel()
    worst = np.zeros(3)
    for y0 in range(lo_y, hi_y + 1, 4):  # each 2x2 block: four Y values around one (U, V) pair
        ys = np.minimum(np.arange(y0, y0 + 4), hi_y).reshape(2, 2)
        y_plane = np.tile(ys, (1, len(u)))
        frame = device.nv12(y_plane, u[None].astype(np.uint8), v[None].astype(np.uint8)).astype(np.uint8)
        ups = np.stack([y_plane, np.repeat(np.repeat(u[None], 2, 0), 2, 1), np.repeat(np.repeat(v[None], 2, 0), 2, 1)], -1)
        dev = csc(ups.astype(np.uint8), s.matrix("RGB"), s.input_bias)
        ref = aipp.decode(frame, s)[..., ::-1]
        worst = np.maximum(worst, np.abs(dev - ref.astype(np.int64)).max(axis=(0, 1)))
    bound = csc_error_bound(s, aipp.DECODERS[standard][1])
    assert np.all(worst <= bound), (worst, bound)
    assert np.all(bound < 2.5)  # a couple of levels: the Q8 matrix, the floor and the decoder's rounding


def test_crop_and_padding_equal_the_independent_statement():
    """RGB888_U8 frames of 50x40 cropped at an odd position to 29x31, padded top 1 / left 3 to the 32x32 input:
    the crop keeps exactly the image's region, the border is padding_value in the output (not normalized)."""
    g = aipp.Geometry(src=(50, 40), crop=(5, 3, 29, 31), padding=(1, 0, 3, 0), padding_value=-1.5)
    params, cfg = rendered("RGB888_U8", geom=g)
    img = random_image(seed=6)
    frame = device_frame(params, img, "BGR")
    assert frame.shape == (40, 50, 3)
    np.testing.assert_array_equal(frame[3:34, 5:34], img[1:, 3:])  # the image region sits in the crop window
    out = apply(params, frame)
    np.testing.assert_array_equal(out, doc.aipp(cfg, frame).astype(np.float32))
    assert np.all(out[:, 0, :] == np.float16(-1.5)) and np.all(out[:, :, :3] == np.float16(-1.5))
    want = (img[1:, 3:, ::-1] / 255.0 - np.array(MEAN)) / np.array(STD)  # the training normalization of the region
    assert np.abs(out[:, 1:, 3:] - want.transpose(2, 0, 1)).max() < 5e-3 * max(1, np.abs(want).max())
    # what lies outside the crop window does not reach the output
    noisy = frame.copy()
    noisy[:3], noisy[:, :5], noisy[34:], noisy[:, 34:] = 7, 7, 7, 7
    np.testing.assert_array_equal(apply(params, noisy), out)


def test_yuv420sp_crop_and_padding_equal_the_independent_statement():
    g = aipp.Geometry(src=(40, 36), crop=(4, 2, 28, 32), padding=(0, 0, 2, 2), padding_value=0.25)
    params, cfg = rendered("YUV420SP_U8", geom=g)
    img = random_image(seed=7)
    frame = device_frame(params, img, "BGR")
    assert frame.shape == (54, 40)
    out = apply(params, frame)
    np.testing.assert_array_equal(out, doc.aipp(cfg, frame).astype(np.float32))
    assert np.all(out[:, :, :2] == np.float16(0.25)) and np.all(out[:, :, 30:] == np.float16(0.25))
    noisy = frame.copy()
    noisy[:2], noisy[:36, :4], noisy[36], noisy[36:, :4] = 3, 3, 3, 3  # Y rows/columns and UV outside the window
    np.testing.assert_array_equal(apply(params, noisy), out)


@pytest.mark.parametrize("value", [0.0, -2.0, 3.14159])
def test_padding_value_is_the_output_value_after_normalization(value):
    """Padding comes after DTC: padded pixels hold float16(padding_value), whatever mean and var_reci are."""
    g = aipp.Geometry(src=(26, 30), padding=(1, 1, 3, 3), padding_value=value)
    params, cfg = rendered("RGB888_U8", geom=g)
    frame = device_frame(params, random_image(seed=8), "BGR")
    out = apply(params, frame)
    border = np.ones((32, 32), bool)
    border[1:31, 3:29] = False
    assert np.all(out[:, border] == np.float32(np.float16(value)))
    np.testing.assert_array_equal(out, doc.aipp(cfg, frame).astype(np.float32))


@pytest.mark.parametrize("frame_order", ["RGB", "BGR"])
def test_xrgb_frames_drop_the_x_byte_after_the_ax_swap(frame_order):
    params, cfg = rendered("XRGB8888_U8", frame_order=frame_order)
    img = random_image(seed=9)
    frame = device_frame(params, img, frame_order)
    assert frame.shape == (32, 32, 4) and np.all(frame[..., 0] == device.XRGB_X)
    assert params["ax_swap_switch"] == "true" and params["rbuv_swap_switch"] == ("true" if frame_order == "BGR" else "false")
    out = apply(params, frame)
    np.testing.assert_array_equal(out, doc.aipp(cfg, frame).astype(np.float32))
    want = (img[..., ::-1] / 255.0 - np.array(MEAN)) / np.array(STD)
    assert np.abs(out - want.transpose(2, 0, 1)).max() < 5e-3 * max(1, np.abs(want).max())
    # without ax_swap_switch the device keeps X, R, G: not the training input
    kept = apply({**params, "ax_swap_switch": "false"}, frame)
    assert np.abs(kept - out).max() > 1


def test_gray_frames_with_crop_and_padding():
    g = aipp.Geometry(src=(20, 40), crop=(0, 6, 16, 30), padding=(1, 1, 8, 8), padding_value=0.0)
    params, cfg = rendered("YUV400_U8", channel_order="GRAY", frame_order="GRAY", geom=g, shape=(1, 1, 32, 32))
    img = random_image(seed=10, gray=True)
    frame = device_frame(params, img, "GRAY")
    assert frame.shape == (40, 20)
    np.testing.assert_array_equal(apply(params, frame), doc.aipp(cfg, frame).astype(np.float32))


# ----------------------------------------------------------------------------- the check, for YUV420SP_U8

@pytest.mark.parametrize("standard", list(STANDARDS))
def test_yuv420sp_config_is_verified_within_the_colour_conversion_bound(tmp_path, standard):
    report = build_and_verify(cfg_with(aipp={"template": None, "input_format": "YUV420SP_U8", "color_matrix": standard}),
                              CALIB, tmp_path / "aipp.cfg")
    csc_report = report["csc"]
    assert report["input_format"] == "YUV420SP_U8" and csc_report["standard"] == standard
    assert csc_report["row_order"] == "RGB"  # the demo network was trained on RGB
    # within the bound of the frames as they decode, and (reported) further from the original images
    assert report["max_abs_diff"] <= max(csc_report["bound"]) + 5e-3 * 5
    assert csc_report["against_original"]["max_abs_diff"] > report["max_abs_diff"]
    assert aipp.parse((tmp_path / "aipp.cfg").read_text())["csc_switch"] == "true"


def test_yuv420sp_config_with_the_rows_in_the_wrong_order_fails(tmp_path):
    params, _ = rendered("YUV420SP_U8", channel_order="BGR")  # BGR rows; the demo trained on RGB
    bad = tmp_path / "bad.cfg"
    bad.write_text(aipp.render(aipp_templates.path("static_yuv420sp_u8.cfg"), {
        **aipp.aipp_values((1, 3, 32, 32), MEAN, STD, "0-1", "RGB", "BGR", input_format="YUV420SP_U8"),
        **{k: v for k, v in params.items() if k.startswith("matrix_")}}))
    with pytest.raises(AippMismatchError, match="does not reproduce.*bad.cfg|bad.cfg.*does not reproduce") as e:
        build_and_verify(cfg_with(aipp={"config_file": str(bad)}), CALIB, tmp_path / "o.cfg")
    assert "matrix 298 516 0 / 298 -100 -208 / 298 0 409" in str(e.value)
    assert "decoded to BGR by OpenCV COLOR_YUV2BGR_NV12" in str(e.value)


def test_crop_and_padding_are_checked_on_the_frame_region(tmp_path):
    cfg = cfg_with(aipp={"padding": {"top": 2, "bottom": 2, "left": 4, "right": 4}, "padding_value": 0.0,
                         "src_image_size": [40, 40], "load_start_pos": [6, 4]})
    report = build_and_verify(cfg, CALIB, tmp_path / "aipp.cfg")
    params = aipp.parse((tmp_path / "aipp.cfg").read_text())
    assert (params["crop"], params["crop_size_w"], params["crop_size_h"]) == ("true", "24", "28")
    assert (params["load_start_pos_w"], params["load_start_pos_h"]) == ("6", "4")
    assert [params[f"{s}_padding_size"] for s in ("top", "bottom", "left", "right")] == ["2", "2", "4", "4"]
    assert report["max_abs_diff"] < 5e-3 and report["crop"]["frame"] == [40, 40]
    assert report["padding"]["pixels"] == 32 * 32 - 24 * 28
    assert report["padding"]["training_border_mean_abs_diff"] > 0  # the border's real pixels, reported


# ----------------------------------------------------------------------------- [aipp] settings

def test_the_template_follows_the_input_format():
    cfg = cfg_with(aipp={"template": None, "input_format": "YUV420SP_U8"})
    assert cfg.aipp.template == Path("static_yuv420sp_u8.cfg") and cfg.aipp_template.is_file()
    assert sorted(aipp_templates.shipped()) == ["static_rgb888_u8.cfg", "static_xrgb8888_u8.cfg",
                                                "static_yuv400_u8.cfg", "static_yuv420sp_u8.cfg"]


@pytest.mark.parametrize("settings, message", [
    ({"color_matrix": "bt601_full", "input_format": "RGB888_U8"}, "aipp.color_matrix applies to YUV420SP_U8"),
    ({"color_matrix": "bt2020"}, "aipp.color_matrix"),
    ({"input_format": "NV12"}, "aipp.input_format"),
    ({"input_format": "YUV420SP_U8", "crop_size": [31, 32]}, "aipp.crop_size [31, 32]: must be even"),
    ({"padding": {"top": 33}}, "aipp.padding.top"),
    ({"padding": {"middle": 1}}, "aipp.padding.middle: unknown key"),
    ({"padding_value": float("nan")}, "aipp.padding_value"),
    ({"crop_size": [0, 32]}, "aipp.crop_size"),
    ({"src_image_size": [20, 20], "crop_size": [32, 32]}, "aipp.load_start_pos + aipp.crop_size (0 + 32) exceeds"),
    ({"config_file": "x.cfg", "crop_size": [32, 32]}, "aipp.crop_size: not used with aipp.config_file"),
    ({"template": None}, "give aipp.input_format"),
])
def test_aipp_settings_are_validated_by_field(settings, message):
    with pytest.raises(ConfigError) as e:
        cfg_with(aipp=settings)
    assert message in str(e.value)


@pytest.mark.parametrize("settings, message", [
    ({"crop_size": [30, 32]}, "aipp.crop_size [30, 32] plus aipp.padding must give the 32x32 model input"),
    ({"padding": {"left": 20, "right": 20}}, "leaves nothing of the 32x32 model input"),
    ({"src_image_size": [40, 40], "load_start_pos": [10, 10]}, "aipp.load_start_pos [10, 10] + the 32x32 crop exceeds"),
    ({"template": None, "input_format": "YUV420SP_U8", "padding": {"left": 1}},
     "crop (model input less aipp.padding) [31, 32] must be even"),
    ({"input_format": "YUV420SP_U8"}, "writes input_format RGB888_U8, but aipp.input_format is YUV420SP_U8"),
])
def test_aipp_settings_that_do_not_fit_the_model_input_fail_by_field(tmp_path, settings, message):
    with pytest.raises(ConfigError) as e:
        build_and_verify(cfg_with(aipp=settings), CALIB, tmp_path / "a.cfg")
    assert message in str(e.value)


def test_padding_wider_than_the_310p_limit_is_refused():
    d = tomllib.loads((REPO / "quantflow.toml").read_text())
    d["model"]["input_shape"] = [1, 3, 32, 1100]
    d["aipp"]["padding"] = {"left": 2}
    with pytest.raises(ConfigError, match="aipp.padding: the padded output is 1100 wide; Ascend310P3 pads"):
        geometry(config_from_dict(d, root=REPO), "RGB888_U8")


def test_a_template_without_the_crop_block_is_refused(tmp_path):
    t = tmp_path / "mine.cfg"
    t.write_text(aipp_templates.path("static_rgb888_u8.cfg").read_text().replace("    ${crop}\n", "    crop : false\n"))
    with pytest.raises(ConfigError, match=re.escape("does not write the crop that [aipp] asks for (put ${crop}")):
        build_and_verify(cfg_with(aipp={"template": str(t), "src_image_size": [40, 40]}), CALIB, tmp_path / "a.cfg")


def test_read_image_frames_of_the_calibration_set_are_even_for_yuv():
    # the shipped demo images are 32x32: NV12 frames need even sizes
    assert all(d % 2 == 0 for d in read_image(CALIB[0], 3).shape[:2])


@pytest.mark.parametrize("mean,scale", [([-0.5, 0.0, 0.0], "0-1"), ([600.0, 0.0, 0.0], "0-255")])
def test_a_mean_aipp_cannot_subtract_names_the_field(mean, scale, tmp_path):
    """mean_chn is a uint8 and min_chn in [0, 255] on the device: a pixel-domain mean outside [0, 510] has no AIPP
    form (a negative one went into a negative min_chn before)."""
    cfg = cfg_with(normalization={"mean": mean, "scale": scale, "reference": None})
    with pytest.raises(ConfigError, match=r"normalization.mean\[0\] = .* AIPP subtracts mean_chn_0"):
        build_and_verify(cfg, CALIB, tmp_path / "a.cfg")


def test_a_hand_written_min_chn_outside_its_range_is_refused(tmp_path):
    text = aipp.render(aipp_templates.path("static_rgb888_u8.cfg"), aipp.aipp_values(
        (1, 3, 32, 32), [0.5, 0.5, 0.5], [0.25, 0.25, 0.25], "0-1", "RGB", "BGR"))
    bad = text.replace("min_chn_0 : 0.5", "min_chn_0 : -0.5")
    assert bad != text
    with pytest.raises(AippMismatchError, match="min_chn_0: must be in \\[0, 255\\]"):
        apply(aipp.parse(bad), np.zeros((32, 32, 3), np.uint8))
