"""Anchor-based detection heads (evaluation/anchors.py, evaluation.metric = "anchor_detection"): MediaPipe's SSD
anchors, the outputs picked from their shapes, what ``quantflow init`` recognises (evaluation/heads.py) and
writes, and the metric's numbers, changed counts and steering figure on hand-built regressors and logits, per
anchor (anchors not known) and after NMS against MediaPipe's anchors."""
from __future__ import annotations

import math
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantflow.cli import main
from quantflow.config import config_from_dict, load_config
from quantflow.errors import ConfigError
from quantflow.evaluation.anchors import AnchorDetection, decode, mediapipe_anchors, pick_outputs
from quantflow.evaluation.detection import iou, xyxy
from quantflow.evaluation.heads import grid, recognise
from quantflow.evaluation.task import Batch, TaskMetric

rng = np.random.default_rng(0)


def _batch(n, h, w):
    paths = tuple(Path("/data") / f"{k}.png" for k in range(n))
    return Batch(paths, tuple(p.name for p in paths), np.zeros((n, h, w, 3), np.uint8))


def _sigmoid(x):
    return 1 / (1 + np.exp(-np.asarray(x, np.float64)))


# ------------------------------------------------------------------------------------------------ anchors
def test_mediapipe_anchors_of_blazeface_palm_and_pose():
    a = mediapipe_anchors(128, 128, (8, 16, 16, 16), 2)
    assert len(a) == 16 * 16 * 2 + 8 * 8 * 3 * 2 == 896                  # BlazeFace short range
    assert np.allclose(a[0], [0.5 / 16, 0.5 / 16, 1, 1]) and np.allclose(a[1], a[0])   # 2 per cell
    assert np.allclose(a[2], [1.5 / 16, 0.5 / 16, 1, 1])                  # the next cell along the row
    assert np.allclose(a[32], [0.5 / 16, 1.5 / 16, 1, 1])                 # the next row: 16 cells x 2 later
    assert np.allclose(a[512:518], [0.5 / 8, 0.5 / 8, 1, 1])              # the merged stride-16 layers: 6 per cell
    assert len(mediapipe_anchors(192, 192, (8, 16, 16, 16), 2)) == 24 * 24 * 2 + 12 * 12 * 6 == 2016   # BlazePalm
    assert len(mediapipe_anchors(224, 224, (8, 16, 32, 32, 32), 2)) == 28 * 28 * 2 + 14 * 14 * 2 + 7 * 7 * 6 == 2254
    assert len(mediapipe_anchors(192, 192, (4,), 1)) == 48 * 48                                     # full range


def test_pick_outputs():
    assert pick_outputs({"regressors": [1, 896, 16], "classificators": [1, 896, 1]}) == \
        ("regressors", "classificators", [])
    assert pick_outputs({"conf": [1, 4200, 2], "loc": [1, 4200, 4], "landms": [1, 4200, 10]}) == \
        ("loc", "conf", ["landms"])                                       # RetinaFace
    assert pick_outputs({"raw_boxes": [1, 1917, 4], "raw_scores": [1, 1917, 91]}) == \
        ("raw_boxes", "raw_scores", [])                                   # SSD: 91 class columns, wider than boxes
    assert pick_outputs({"b": [1, 896, 16], "s": [1, 896]}) == ("b", "s", [])   # scores without their last axis
    assert pick_outputs({"b": [1, 896, 16], "s": [1, 895, 1]}) is None          # not the same anchors
    assert pick_outputs({"b": [1, 32, 4], "s": [1, 32, 1]}) is None             # too few rows for anchors
    assert pick_outputs({"b": [1, 896, 5], "s": [1, 896, 1]}) is None           # 5 columns: no box + keypoints
    assert pick_outputs({"b": [1, 896, 16]}) is None


# ------------------------------------------------------------------------------------------------ what init sees
def _blazeface(n=1):
    regressors = rng.uniform(-60, 60, (n, 896, 16))
    logits = rng.normal(-40, 60, (n, 896, 1))
    logits[0, 0, 0] = -436.0                  # background anchors reach far below the package's clip
    return {"regressors": regressors, "classificators": logits}


def test_recognise_blazeface_with_mediapipe_anchors():
    head = recognise(_blazeface(), (1, 3, 128, 128))
    assert head.metric == "anchor_detection", head.what
    assert head.options == {"boxes": "regressors", "scores": "classificators", "activation": "sigmoid",
                            "anchors": "mediapipe", "anchor_strides": [8, 16, 16, 16], "anchors_per_cell": 2,
                            "box_scale": [128, 128, 128, 128], "clip": 100.0}
    assert "6 keypoints" in head.what and "896 = MediaPipe's SSD anchors" in head.what
    TaskMetric(head.metric, head.options)
    # the same head at an input size whose anchors MediaPipe's settings do not give: matched per anchor
    other = recognise(_blazeface(), (1, 3, 100, 100))
    assert other.metric == "anchor_detection" and "anchors" not in other.options, other.what


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("outputs,options", [
    ({"loc": rng.normal(size=(1, 1000, 4)), "conf": _softmax(rng.normal(size=(1, 1000, 2))),
      "landms": rng.normal(size=(1, 1000, 10))},                                  # RetinaFace, softmax applied
     {"boxes": "loc", "scores": "conf", "activation": "none", "background": 0, "box_coder": "exp",
      "box_scale": [10.0, 10.0, 5.0, 5.0]}),
    ({"loc": rng.normal(size=(1, 1000, 4)), "conf": rng.normal(0, 4, (1, 1000, 2))},   # two-class logits
     {"boxes": "loc", "scores": "conf", "activation": "softmax", "background": 0, "box_coder": "exp",
      "box_scale": [10.0, 10.0, 5.0, 5.0]}),
    ({"box_encodings": rng.normal(size=(1, 1917, 4)), "class_predictions": rng.normal(0, 4, (1, 1917, 91))},
     {"boxes": "box_encodings", "scores": "class_predictions", "activation": "sigmoid", "background": 0,
      "box_coder": "exp", "box_scale": [10.0, 10.0, 5.0, 5.0]}),                  # TF's SSD, sigmoid logits
])
def test_recognise_anchor_heads_whose_anchors_the_file_does_not_give(outputs, options):
    head = recognise(outputs, (1, 3, 300, 300))
    assert (head.metric, head.options) == ("anchor_detection", options), head.what
    assert "matched per anchor" in head.what
    TaskMetric(head.metric, head.options)


def test_a_yolo_grid_split_into_boxes_and_scores_is_not_an_anchor_head():
    g = grid(64, 64)
    head = recognise({"boxes": rng.uniform(0, 64, (1, g, 4)), "scores": rng.uniform(0, 1, (1, g, 3))},
                     (1, 3, 64, 64))
    assert head.metric == "outputs", head.what


# ------------------------------------------------------------------------------------------------ per anchor
# one 10x10 image, 6 anchors, one class of logits; index mode: boxes decoded against a unit anchor (linear, scale 1),
# so the regressors (cx, cy, w, h) are fractions of the image
F_LOGITS = np.array([3.0, 3.0, -5.0, 2.0, -436.0, 0.1])
Q_LOGITS = np.array([3.0, -1.0, -5.0, 2.0, 1.0, 0.1])
F_BOX = np.tile([0.5, 0.5, 0.2, 0.2], (6, 1))
Q_BOX = F_BOX.copy()
Q_BOX[3, 0] = 0.6        # 1 pixel right of a 2-pixel box: IoU 1/3
Q_BOX[5, 0] = 0.52       # 0.2 pixel right: IoU 3.6 / 4.4


def test_per_anchor_matching_numbers_changed_and_steering():
    m = TaskMetric("anchor_detection", {"boxes": "b", "scores": "s", "clip": 100.0})
    fp = {"b": F_BOX[None], "s": F_LOGITS[None, :, None]}
    q = {"b": Q_BOX[None], "s": Q_LOGITS[None, :, None]}
    records = m.record(fp, q, _batch(1, 10, 10))
    # sigmoid >= 0.5 where the logit >= 0: FP32 anchors 0, 1, 3, 5; INT8 0, 3, 4, 5; same box at 0, IoU 0.82 at 5
    assert (1 / 3) < 0.5 <= 3.6 / 4.4
    assert records[0]["fp32"] == 4 and records[0]["int8"] == 4 and records[0]["matched"] == 2
    numbers = m.summarize(records)
    assert numbers["f1"] == pytest.approx(2 * 2 / (4 + 4)) and numbers["precision"] == 0.5 == numbers["recall"]
    # changed: FP32's anchors 1 and 3 unmatched, INT8's 3 (moved) and 4 (new)
    assert AnchorDetection(boxes="b", scores="s").changed(records[0]) == 4 and AnchorDetection.outcome == "boxes"
    # steering: anchors either network scores >= 0.25 (half the threshold): all but anchor 2
    near = [0, 1, 3, 4, 5]
    sf, sq = _sigmoid(F_LOGITS[near]), _sigmoid(Q_LOGITS[near])
    score_db = 10 * math.log10(np.sum(sf ** 2) / np.sum((sf - sq) ** 2))
    box_noise = (10 * 0.1) ** 2 * 2 + (10 * 0.02) ** 2 * 2          # x1 and x2 of anchors 3 and 5, in pixels
    box_signal = len(near) * (2 ** 2 + 2 ** 2) / 2                 # FP32's (w^2 + h^2) / 2, 2-pixel boxes
    box_db = 10 * math.log10(box_signal / box_noise)
    s = m.steering(records)
    assert s["regions"]["scores near the threshold"] == pytest.approx(score_db)
    assert s["regions"]["boxes near the threshold"] == pytest.approx(box_db)
    assert s["value"] == pytest.approx(min(score_db, box_db))
    # identical outputs: F1 1, nothing changed, no noise
    same = m.record(fp, fp, _batch(1, 10, 10))
    assert m.summarize(same)["f1"] == 1.0 and AnchorDetection().changed(same[0]) == 0


def test_the_unit_anchor_iou_is_the_decoded_boxes_iou():
    """Per anchor the boxes are compared decoded against a unit anchor: the IoU any anchor would give (exp coder)."""
    o = AnchorDetection(box_coder="exp", box_scale=[10, 10, 5, 5]).o
    f, q = rng.normal(0, 1, (1, 50, 4)), rng.normal(0, 1, (1, 50, 4))
    unit = np.tile([0.0, 0.0, 1.0, 1.0], (50, 1))
    anchors = np.concatenate([rng.uniform(0, 1, (50, 2)), rng.uniform(0.05, 0.5, (50, 2))], 1)
    at_unit = np.diag(iou(xyxy(decode(f, unit, o, 64, 48)[0]), xyxy(decode(q, unit, o, 64, 48)[0])))
    at_anchors = np.diag(iou(xyxy(decode(f, anchors, o, 64, 48)[0]), xyxy(decode(q, anchors, o, 64, 48)[0])))
    assert np.allclose(at_unit, at_anchors) and at_unit.max() > 0


def test_softmax_scores_drop_the_background_column():
    m = TaskMetric("anchor_detection", {"boxes": "loc", "scores": "conf", "activation": "softmax", "background": 0,
                                        "box_coder": "exp"})
    loc = np.zeros((1, 64, 4))             # every box the whole image (exp(0) = 1 anchor)
    f = np.zeros((1, 64, 2))
    f[0, :, 0] = 2.0                       # background over face by 2: face p = sigmoid(-2) = 0.12 ...
    f[0, :3] = [0.0, 2.0]                  # ... but on anchors 0-2, face by 2: p = sigmoid(2) = 0.88
    q = f.copy()
    q[0, 2, 1] = -2.0                      # INT8 loses anchor 2 (face p = sigmoid(-2))
    numbers = m.summarize(m.record({"loc": loc, "conf": f}, {"loc": loc, "conf": q}, _batch(1, 8, 8)))
    # the background column (p >= 0.5 on every other anchor) is no detection
    assert (numbers["fp32_detections"], numbers["int8_detections"], numbers["matched"]) == (3, 2, 2)


# ------------------------------------------------------------------------------------------------ mediapipe anchors
def test_mediapipe_anchors_decode_and_match_after_nms():
    """A 16x16 input, one stride-8 layer, one anchor per cell: centres (4, 4), (12, 4), (4, 12), (12, 12) pixels.
    Regressors in input pixels (box_scale = the input size, as MediaPipe's x_scale): cx = tx + anchor x."""
    options = {"boxes": "r", "scores": "c", "anchors": "mediapipe", "anchor_strides": [8], "anchors_per_cell": 1,
               "box_scale": [16, 16, 16, 16]}
    r = np.zeros((1, 4, 6))                          # a box and one keypoint per anchor
    r[0, 0, :4] = [2, 2, 8, 8]                       # anchor 0 (4, 4) -> a face at (6, 6), 8 x 8
    r[0, 1, :4] = [-6, 2, 8, 8]                      # anchor 1 (12, 4) -> the same face
    r[0, 3, :4] = [0, 0, 4, 4]                       # anchor 3 -> (12, 12), 4 x 4
    m = TaskMetric("anchor_detection", options)
    boxes = decode(r, mediapipe_anchors(16, 16, (8,), 1), AnchorDetection(**options).o, 16, 16)
    assert np.allclose(boxes[0, :2], [[6, 6, 8, 8], [6, 6, 8, 8]]) and np.allclose(boxes[0, 3], [12, 12, 4, 4])
    f = np.array([3.0, 2.0, -9.0, -9.0])[None, :, None]      # FP32: the face by anchors 0 and 1; NMS keeps 0
    q = np.array([-1.0, 2.5, -9.0, 1.0])[None, :, None]      # INT8: the face by anchor 1 only, and anchor 3's box
    records = m.record({"r": r, "c": f}, {"r": r, "c": q}, _batch(1, 16, 16))
    assert (records[0]["fp32"], records[0]["int8"], records[0]["matched"]) == (1, 2, 1)
    assert m.summarize(records)["f1"] == pytest.approx(2 * 1 / (1 + 2))
    assert AnchorDetection(**options).changed(records[0]) == 1      # INT8's extra box
    # read per anchor instead (anchors not known), FP32's two anchors of one face count twice
    per = TaskMetric("anchor_detection", {**options, "anchors": "index"})
    got = per.record({"r": r, "c": f}, {"r": r, "c": q}, _batch(1, 16, 16))[0]
    assert (got["fp32"], got["int8"], got["matched"]) == (2, 2, 1)


def test_errors_name_the_option_and_output():
    with pytest.raises(ConfigError, match="evaluation.options.anchor_strides"):
        AnchorDetection(anchors="mediapipe")
    with pytest.raises(ConfigError, match="evaluation.options.nms"):
        AnchorDetection(nms=0.3)
    m = AnchorDetection(anchors="mediapipe", anchor_strides=[8, 16], anchors_per_cell=1, boxes="r", scores="c")
    out = {"r": np.zeros((1, 100, 16)), "c": np.zeros((1, 100, 1))}
    with pytest.raises(ConfigError, match=r"anchor_strides: strides \[8, 16\] .* give 80 anchors at 64x64, the "
                                          r"output holds 100"):   # 8 x 8 + 4 x 4 cells
        m.batch(out, out, _batch(1, 64, 64))
    with pytest.raises(ConfigError, match="evaluation.options.boxes: the network has no output 'r'"):
        AnchorDetection(boxes="r", scores="c").batch({"x": out["r"], "c": out["c"]}, {}, _batch(1, 64, 64))
    with pytest.raises(ConfigError, match="evaluation.options.activation: softmax over output c"):
        AnchorDetection(activation="softmax").batch(out, out, _batch(1, 64, 64))
    with pytest.raises(ConfigError, match=r"scores / boxes: the outputs \(a \[1, 100, 3\]\)"):
        AnchorDetection().batch({"a": np.zeros((1, 100, 3))}, {}, _batch(1, 64, 64))
    with pytest.raises(ConfigError, match="evaluation.options"):
        config_from_dict({"model": {"onnx": "m.onnx", "input_shape": [1, 3, 32, 32]},
                          "normalization": {"mean": [0, 0, 0], "std": [1, 1, 1], "scale": "0-1",
                                            "channel_order": "RGB"},
                          "calibration": {"data_dir": "c", "count": 4}, "aipp": {"template": "static_rgb888_u8.cfg"},
                          "evaluation": {"data_dir": "e", "metric": "anchor_detection",
                                         "options": {"activation": "relu"}}})


# ------------------------------------------------------------------------------------------------ init on ONNX heads
def _model(outputs: dict, size: int, activation: dict | None = None):
    """An ONNX network [1, 3, size, size] -> each output of ``outputs`` (name -> (shape, weight scale)): the image's
    channel means through a dense layer, reshaped, then ``activation[name]`` (an ONNX op) where given."""
    init, nodes, outs = [], [helper.make_node("GlobalAveragePool", ["image"], ["pooled"]),
                             helper.make_node("Flatten", ["pooled"], ["flat"])], []
    for name, (shape, scale) in outputs.items():
        init += [numpy_helper.from_array(rng.normal(0, scale, (3, int(np.prod(shape)))).astype(np.float32), f"w_{name}"),
                 numpy_helper.from_array(np.asarray(shape, np.int64), f"shape_{name}")]
        last = name if not (activation or {}).get(name) else f"pre_{name}"
        nodes += [helper.make_node("MatMul", ["flat", f"w_{name}"], [f"dense_{name}"]),
                  helper.make_node("Reshape", [f"dense_{name}", f"shape_{name}"], [last])]
        if last != name:
            nodes.append(helper.make_node(activation[name], [last], [name]))
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
    g = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                        [1, 3, size, size])], outs, init)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _images(folder, size, n=3):
    import cv2
    folder.mkdir(parents=True)
    for k in range(n):
        cv2.imwrite(str(folder / f"{k}.png"), rng.integers(0, 255, (size, size, 3)).astype(np.uint8))


@pytest.mark.parametrize("outputs,activation,size,metric,options", [
    ({"regressors": ((1, 896, 16), 200.0), "classificators": ((1, 896, 1), 400.0)}, None, 128, "anchor_detection",
     {"boxes": "regressors", "scores": "classificators", "activation": "sigmoid", "anchors": "mediapipe",
      "anchor_strides": [8, 16, 16, 16], "anchors_per_cell": 2, "box_scale": [128, 128, 128, 128], "clip": 100.0}),
    ({"output_1": ((1, 32, 32, 1), 1.0)}, {"output_1": "Sigmoid"}, 32, "segmentation", {"axis": 3}),
    ({"mask": ((1, 1, 32, 32), 1.0)}, {"mask": "Sigmoid"}, 32, "segmentation", {}),
    ({"out": ((1, 1, 32, 32), 1.0)}, {"out": "Sigmoid"}, 32, "text_regions", {}),
], ids=["blazeface", "selfie-nhwc", "mask-named", "db-map"])
def test_init_writes_the_gate(tmp_path, outputs, activation, size, metric, options):
    onnx.save(_model(outputs, size, activation), tmp_path / "m.onnx")
    _images(tmp_path / "calib", size)
    _images(tmp_path / "eval", size)
    out = tmp_path / "quantflow.toml"
    assert main(["init", "--onnx", str(tmp_path / "m.onnx"), "--calib", str(tmp_path / "calib"),
                 "--eval", str(tmp_path / "eval"), "-o", str(out)]) == 0
    text = out.read_text()
    e = load_config(out).evaluation
    assert e.metric == metric and dict(e.options) == options, text
    written = tomllib.loads(text)["evaluation"]
    assert written["min"] == TaskMetric(metric, options).defaults["min"]   # f1 >= 0.9; miou, pixel_agreement
