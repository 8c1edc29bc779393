"""Head recognition (evaluation/heads.py) from the outputs' shapes and values, and ``quantflow init`` writing the
recognised head's metric, limits, options and parts (reported, not gated) on small synthetic ONNX heads of each
layout; each written config loads."""
from __future__ import annotations

import tomllib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantflow.cli import main
from quantflow.config import load_config
from quantflow.evaluation.heads import grid, recognise
from quantflow.evaluation.task import TaskMetric

H = W = 64
G = grid(H, W)          # 8x8 + 4x4 + 2x2 anchor points of strides 8, 16, 32
rng = np.random.default_rng(0)


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_grid_is_the_anchor_points_of_the_strides():
    assert G == 64 + 16 + 4 and grid(H, W, (8, 16, 32, 64)) == G + 1 and grid(320, 320) == 2100 and grid(416, 416) == 3549 and grid(640, 640) == 8400


@pytest.mark.parametrize("outputs,metric,options", [
    ({"logits": rng.normal(size=(1, 10))}, "top1", {}),
    ({"output0": rng.uniform(0, 60, (1, 4 + 3, G))}, "detection", {"layout": "yolov8"}),
    ({"p2": rng.uniform(0, 60, (1, 4 + 3, grid(H, W, (4, 8, 16, 32))))}, "detection", {"layout": "yolov8"}),
    ({"output0": rng.uniform(0, 60, (1, 4 + 3, G + 2))}, "outputs", {}),          # not a grid: no head
    ({"output0": rng.uniform(0, 60, (1, 4 + 3 + 8, G)), "protos": rng.normal(size=(1, 8, 16, 16))}, "outputs", {}),
    ({"output0": rng.uniform(0, 60, (1, 3 * G, 5 + 2))}, "detection", {"layout": "yolov5"}),
    ({"out": rng.uniform(0, 60, (1, 3 * G, 7)), **{f"raw{k}": rng.normal(size=(1, 3, H // s, W // s, 7))
                                                   for k, s in enumerate((8, 16, 32))}},
     "detection", {"layout": "yolov5"}),                                   # mindyolo's YOLOv5: decoded + raw heads
    ({"out": rng.uniform(0, 60, (1, G, 4 + 3)), **{f"raw{k}": rng.normal(size=(1, 64 + 3, H // s, W // s))
                                               for k, s in enumerate((8, 16, 32))}},
     "detection", {"layout": "yolov8_anchors_first", "output": "out"}),  # mindyolo's YOLOv8: anchors first
    ({"output": rng.uniform(-1, 2, (1, G, 5 + 1))}, "detection", {"layout": "yolox"}),     # raw offsets
    ({"output": rng.uniform(0, 64, (1, G, 5 + 1))}, "detection", {"layout": "yolov5"}),    # decoded pixels
    ({"seq": _softmax(rng.normal(size=(1, 5, 12)))}, "ctc", {"layout": "ntc"}),            # [1, T, C], T < C
    ({"seq": _softmax(rng.normal(size=(12, 1, 5)))}, "ctc", {"layout": "tnc"}),            # [T, 1, C], T > C
    ({"seq": rng.normal(size=(12, 1, 30))}, "ctc", {"layout": "tnc"}),                     # a CRNN's logits
    ({"seq": rng.normal(size=(1, 5, 12))}, "outputs", {}),                                 # no softmax, no time axis
    ({"map": rng.uniform(0, 1, (1, 1, H, W))}, "text_regions", {}),
    ({"map": rng.normal(size=(1, 1, H, W))}, "outputs", {}),                               # not in 0..1
    ({"seg": rng.normal(size=(1, 5, H, W))}, "segmentation", {}),
    ({"seg": rng.normal(size=(1, 5, H // 4, W // 4))}, "segmentation", {}),
    ({"seg": rng.normal(size=(1, 5, H // 3, W // 3))}, "outputs", {}),
    ({"a": rng.normal(size=(1, 4, 4)), "b": rng.normal(size=(1, 9))}, "outputs", {}),
])
def test_recognise(outputs, metric, options):
    head = recognise(outputs, (1, 3, H, W))
    assert (head.metric, head.options) == (metric, options), head.what
    if metric not in ("top1", "outputs"):
        TaskMetric(metric, head.options)         # the options it proposes are the metric's


def test_recognise_gives_yolo_heads_their_parts():
    v8 = recognise({"output0": rng.uniform(0, 60, (1, 7, G))}, (1, 3, H, W))
    assert {k: (p["axis"], p["slice"]) for k, p in v8.parts.items()} == {"boxes": (1, "0:4"), "scores": (1, "4:")}
    seg = recognise({"output0": rng.uniform(0, 60, (1, 4 + 3 + 8, G)), "protos": rng.normal(size=(1, 8, 16, 16))},
                    (1, 3, H, W))
    assert seg.parts["scores"]["slice"] == "4:7" and seg.parts["masks"]["slice"] == "7:" and "-seg" in seg.what
    assert recognise({"seq": _softmax(rng.normal(size=(1, 40, 66)))}, (1, 3, 48, 320)).parts == {}
    mindyolo = recognise({"out": rng.uniform(0, 60, (1, G, 4 + 3)), **{
        f"raw{k}": rng.normal(size=(1, 64 + 3, H // s, W // s)) for k, s in enumerate((8, 16, 32))}}, (1, 3, H, W))
    assert {k: (p["axis"], p["slice"]) for k, p in mindyolo.parts.items()} == {"boxes": (2, "0:4"),
                                                                                "scores": (2, "4:")}


# ------------------------------------------------------------------------------------------------ init on ONNX heads
def _head_model(shape, activation=None, scale=1.0, extra=None):
    """An ONNX network [1, 3, H, W] -> ``shape``: the image's channel means through a dense layer, reshaped,
    then ``activation`` (Softmax over the last axis, Sigmoid); ``extra``: a second output's shape."""
    size = int(np.prod(shape))
    init = [numpy_helper.from_array((rng.normal(0, scale, (3, size))).astype(np.float32), "w"),
            numpy_helper.from_array(np.asarray(shape, np.int64), "shape")]
    nodes = [helper.make_node("GlobalAveragePool", ["image"], ["pooled"]),
             helper.make_node("Flatten", ["pooled"], ["flat"]),
             helper.make_node("MatMul", ["flat", "w"], ["dense"]),
             helper.make_node("Reshape", ["dense", "shape"], ["out" if activation is None else "pre"])]
    if activation is not None:
        nodes.append(helper.make_node(activation, ["pre"], ["out"], **({"axis": -1} if activation == "Softmax" else {})))
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, list(shape))]
    if extra is not None:
        init += [numpy_helper.from_array(rng.normal(0, 1, (3, int(np.prod(extra)))).astype(np.float32), "w2"),
                 numpy_helper.from_array(np.asarray(extra, np.int64), "shape2")]
        nodes += [helper.make_node("MatMul", ["flat", "w2"], ["dense2"]),
                  helper.make_node("Reshape", ["dense2", "shape2"], ["protos"])]
        outputs.append(helper.make_tensor_value_info("protos", TensorProto.FLOAT, list(extra)))
    g = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, H, W])],
                          outputs, init)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _images(folder, n=3):
    import cv2
    folder.mkdir(parents=True)
    for k in range(n):
        cv2.imwrite(str(folder / f"{k}.png"), rng.integers(0, 255, (H, W, 3)).astype(np.uint8))


@pytest.mark.parametrize("model,metric,options,parts", [
    (_head_model((1, 4 + 3, G), scale=20.0), "detection", {"layout": "yolov8"}, {"boxes": False, "scores": False}),
    (_head_model((1, 4 + 3 + 8, G), scale=20.0, extra=(1, 8, 16, 16)), "outputs", {},
     {"boxes": True, "scores": True, "masks": True}),
    (_head_model((1, 3 * G, 5 + 2), scale=20.0), "detection", {"layout": "yolov5"},
     {"boxes": False, "objectness": False, "scores": False}),
    (_head_model((1, G, 5 + 1), "Sigmoid"), "detection", {"layout": "yolox"},
     {"boxes": False, "objectness": False, "scores": False}),
    (_head_model((1, 6, 40), "Softmax"), "ctc", {"layout": "ntc"}, {}),        # [1, T, C] with T < C
    (_head_model((6, 1, 40)), "ctc", {"layout": "tnc"}, {}),                    # [T, 1, C] logits
    (_head_model((1, 1, H, W), "Sigmoid"), "text_regions", {}, {}),
    (_head_model((1, 4, H // 4, W // 4)), "segmentation", {}, {}),
    (_head_model((1, 6, 40)), "outputs", {}, {}),                               # [1, 6, 40] logits: unknown
], ids=["yolov8", "yolov8-seg", "yolov5", "yolox", "ctc-ntc", "ctc-tnc", "text", "segmentation", "unknown"])
def test_init_writes_the_recognised_heads_gate(tmp_path, model, metric, options, parts):
    onnx.save(model, tmp_path / "m.onnx")
    _images(tmp_path / "calib")
    _images(tmp_path / "eval")
    out = tmp_path / "quantflow.toml"
    assert main(["init", "--onnx", str(tmp_path / "m.onnx"), "--calib", str(tmp_path / "calib"),
                 "--eval", str(tmp_path / "eval"), "-o", str(out)]) == 0
    text = out.read_text()
    cfg = load_config(out)
    e = cfg.evaluation
    assert e.metric == metric and dict(e.options) == options
    assert "# quantflow init recognised " in text and "on 3 calibration images" in text
    assert {k: p.gate for k, p in e.parts.items()} == parts
    if metric not in ("outputs", "top1"):
        defaults = TaskMetric(metric, options).defaults
        written = tomllib.loads(text)["evaluation"]
        # the written limits are the metric's defaults on the numbers it returns without labels
        for kind in ("min", "max"):
            assert written.get(kind, {}) == {k: v for k, v in defaults[kind].items()
                                             if k not in ("accuracy_drop", "map50_drop")}


# ------------------------------------------------------------------------------------------------ gate = false
def test_a_part_with_gate_false_is_reported_never_failing():
    """evaluation.parts.<name>.gate = false: the part's figures and limit are in the report, its failure fails
    nothing; an output whose parts are all reported only is judged whole (the outputs gate still tests it)."""
    from quantflow.config import OutputPart
    from quantflow.evaluation.outputs import compare_outputs, limit_text
    from quantflow.evaluation.parts import regions
    from quantflow.evaluation.runs import region_sums

    f = np.concatenate([rng.uniform(0, 320, (4, 4, 30)), rng.uniform(0, 1, (4, 3, 30))], 1)
    q = f.copy()
    q[:, 4:] = rng.uniform(0, 1, (4, 3, 30))                  # the scores lost
    parts = {"boxes": OutputPart(axis=1, slice="0:4", gate=False), "scores": OutputPart(axis=1, slice="4:", gate=False)}
    regs = regions(parts, [("out", (1, 7, 30))], 0.99)
    assert [(r.label, r.gated) for r in regs] == [("out", True), ("boxes", False), ("scores", False)]
    r = compare_outputs(region_sums({"out": f}, {"out": q}, regs, 4), regs, [f"img{i}" for i in range(4)], 0.99)
    whole, boxes, scores = r["outputs"]
    a, b = f[:, 4:].ravel(), q[:, 4:].ravel()
    assert scores["cosine"] == pytest.approx(a @ b / np.sqrt((a @ a) * (b @ b))) and scores["cosine"] < 0.99
    assert scores["passed"] is None and scores["min_cosine"] == 0.99 and "scores" not in r["failures"]
    assert limit_text(scores) == "cosine >= 0.99 (reported, not gated)"
    assert whole["passed"] is True and r["passed"]            # the boxes' pixels carry the whole output's cosine
    # one part gated, one reported: the output is judged by the gated one
    parts["scores"] = OutputPart(axis=1, slice="4:")
    regs = regions(parts, [("out", (1, 7, 30))], 0.99)
    assert [(r.label, r.gated) for r in regs] == [("out", False), ("boxes", False), ("scores", True)]
    r = compare_outputs(region_sums({"out": f}, {"out": q}, regs, 4), regs, [f"img{i}" for i in range(4)], 0.99)
    assert r["failures"] == ["scores"]


def test_the_report_of_reported_parts_says_so():
    """The text report: a part with gate = false shows its limit as reported, and its output is not said to be
    judged by its parts."""
    from quantflow.evaluation.outputs import rows_text

    row = {"output": "out", "part": None, "where": "", "shape": [1, 7, 30], "cosine": 0.999, "sqnr_db": 30.0,
           "worst_image": "a.png", "worst_image_cosine": 0.99, "max_abs_diff": 0.1, "min_cosine": None,
           "min_sqnr_db": None, "gate": True, "passed": None}
    part = dict(row, part="scores", where="[:, 4:7]", shape=[1, 3, 30], cosine=0.95, min_cosine=0.99, gate=False)
    text = "\n".join(rows_text([row, part]))
    assert "cosine >= 0.99 (reported, not gated)" in text and "judged by its parts" not in text and "FAIL" not in text
    assert "judged by its parts" in "\n".join(rows_text([row, dict(part, gate=True, passed=False)]))


def test_an_anchors_first_yolov8_head_decodes_as_its_transpose():
    """mindyolo's YOLOv8 [N, anchors, 4 + classes] is Ultralytics' [N, 4 + classes, anchors] transposed: the same
    boxes, scores and classes."""
    from quantflow.evaluation.detection import decode

    out = rng.uniform(0, 60, (2, 4 + 3, G))
    for a, b in zip(decode(out, "yolov8", H, W), decode(out.transpose(0, 2, 1), "yolov8_anchors_first", H, W)):
        np.testing.assert_array_equal(a, b)
