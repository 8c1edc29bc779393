"""Task metrics (evaluation.metric = "module:callable" or "detection"): the shipped YOLO detection metric (decoding,
NMS, matching, F1, mAP against YOLO label files), the user's own metric from a module beside the config, the
gate's limits on the numbers, the settings' validation, and a sharded run equal to the single process's."""
from __future__ import annotations

import dataclasses
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from quantflow.config import EngineSection, config_from_dict
from quantflow.errors import ConfigError, DataError, QuantflowError
from quantflow.evaluation import detection as det
from quantflow.evaluation.task import Batch, TaskMetric, judge

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------ geometry
def test_iou_nms_and_matching():
    a = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [100, 100, 110, 110]], float)
    assert det.iou(a, a)[0, 1] == pytest.approx(50 / 150) and det.iou(a, a)[0, 2] == 0 and det.iou(a, a)[2, 2] == 1
    scores, classes = np.array([0.9, 0.8, 0.7]), np.array([0, 0, 0])
    assert det.nms(a, scores, classes, 0.3, 10).tolist() == [0, 2]          # box 1 overlaps box 0 by 0.33
    assert det.nms(a, scores, classes, 0.5, 10).tolist() == [0, 1, 2]
    assert det.nms(a, scores, np.array([0, 1, 0]), 0.3, 10).tolist() == [0, 1, 2]   # class-wise
    assert det.nms(a, scores, classes, 0.5, 2).tolist() == [0, 1]
    # matching: greedy by score, each reference once, same class only
    ref = np.array([[0, 0, 10, 10], [50, 50, 60, 60]], float)
    got = np.array([[1, 0, 11, 10], [0, 1, 10, 11], [50, 50, 60, 60]], float)
    hits = det.match(ref, np.array([0, 1]), got, np.array([0, 0, 0]), np.array([0.5, 0.9, 0.8]), 0.5)
    assert hits.tolist() == [False, True, False]      # the 0.9 box takes the reference; the class-1 box is no match


def test_average_precision_all_point():
    # 3 objects; detections by score: hit, miss, hit -> precision 1, 1/2, 2/3 at recall 1/3, 1/3, 2/3
    ap = det.average_precision(np.array([True, False, True]), np.array([0.9, 0.8, 0.7]), 3)
    assert ap == pytest.approx(1 / 3 * 1 + 1 / 3 * 2 / 3)
    assert det.average_precision(np.array([True, True]), np.array([0.5, 0.6]), 2) == 1.0
    assert det.average_precision(np.zeros(0, bool), np.zeros(0), 2) == 0.0


def _image_boxes():
    """Three objects per image (cx, cy, w, h in pixels of a 64x64 image) and their classes."""
    return np.array([[10, 10, 8, 8], [40, 20, 10, 12], [30, 50, 16, 8]], float), np.array([0, 2, 1])


def _yolov8(n_images=4, anchors=40, classes=3, lose_scores=False, seed=0):
    """A [n, 4 + classes, anchors] head: each image's three objects on anchors 0..2 (scores 0.9), the rest
    background at random boxes (scores below 0.1); with ``lose_scores`` every score 0.05."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n_images, 4 + classes, anchors))
    out[:, :4] = rng.uniform(5, 60, (n_images, 4, anchors))
    out[:, 4:] = rng.uniform(0, 0.1, (n_images, classes, anchors))
    boxes, cls = _image_boxes()
    for k in range(3):
        out[:, :4, k] = boxes[k]
        out[:, 4 + cls[k] % classes, k] = 0.9
    if lose_scores:
        out[:, 4:] = 0.05
    return out


def _batch(n=4, paths=None):
    paths = paths or [Path(f"/nowhere/img{i}.png") for i in range(n)]
    return Batch(tuple(paths), tuple(p.name for p in paths), np.zeros((len(paths), 64, 64, 3), np.uint8))


def test_detections_of_int8_against_fp32():
    m = det.Detection(labels=False)
    fp = {"out": _yolov8()}
    same = m.summarize(m.batch(fp, {"out": fp["out"].copy()}, _batch()))
    assert same["f1"] == same["precision"] == same["recall"] == 1.0 and same["fp32_detections"] == 12
    # boxes a pixel off: still matched at IoU >= 0.5
    moved = fp["out"].copy()
    moved[:, :2] += 1.0
    assert m.summarize(m.batch(fp, {"out": moved}, _batch()))["f1"] == 1.0
    # the class scores lost, the boxes exact: no INT8 detection is left
    lost = m.summarize(m.batch(fp, {"out": _yolov8(lose_scores=True)}, _batch()))
    assert lost["int8_detections"] == 0 and lost["f1"] == 0.0 and lost["precision"] is None
    # one image's classes swapped: its three detections no longer match
    swapped = fp["out"].copy()
    swapped[0, 4:] = swapped[0, 4:][::-1]
    r = m.summarize(m.batch(fp, {"out": swapped}, _batch()))
    assert r["matched"] == 10 and r["f1"] == pytest.approx(20 / 24)
    # nothing detected by either: nothing measured
    none = m.summarize(m.batch({"out": _yolov8(lose_scores=True)}, {"out": _yolov8(lose_scores=True)}, _batch()))
    assert none["f1"] is None and none["fp32_detections"] == 0


def test_the_detection_steering_figure_is_the_scores_and_boxes_near_the_threshold():
    """The fallback's figure for the detection metric: the SQNR of the score and of the box at every anchor and
    class either network scores at least half the threshold (FP32's boxes, matched or missed, INT8's extra ones,
    the near-misses of both), not at the background anchors no network scores near it."""
    m = det.Detection(labels=False)                                  # score_threshold 0.25: the band from 0.125
    fp = _yolov8()
    same = m.steering(m.batch({"o": fp}, {"o": fp.copy()}, _batch()))
    assert same["value"] == float("inf") and same["error"] == 0.0
    assert same["figure"] == "least SQNR dB (scores near the threshold)"
    # every background score moved, all below the band in both: nothing a box could show
    noisy = fp.copy()
    noisy[:, 4:, 3:] = 0.1 - noisy[:, 4:, 3:]
    assert m.steering(m.batch({"o": fp}, {"o": noisy}, _batch()))["value"] == float("inf")
    # in every image: one object's score halved (0.9 -> 0.45, still detected), one lost (0.9 -> 0.1, missed), an
    # extra INT8 detection at a background anchor, and a near-miss neither detects (0.2 in FP32, 0.24 in INT8)
    q = fp.copy()
    boxes, cls = _image_boxes()
    q[:, 4 + cls[0], 0], q[:, 4 + cls[1], 1] = 0.45, 0.1
    q[:, 4, 7] = 0.5
    fp2 = fp.copy()
    fp2[:, 5, 8], q[:, 5, 8] = 0.2, 0.24
    s = m.steering(m.batch({"o": fp2}, {"o": q}, _batch()))
    noise = 0.45 ** 2 + 0.8 ** 2 + (0.5 - fp[:, 4, 7]) ** 2 + 0.04 ** 2          # per image
    signal = 3 * 0.81 + fp[:, 4, 7] ** 2 + 0.2 ** 2
    assert s["regions"]["scores near the threshold"] == pytest.approx(10 * np.log10(signal.sum() / noise.sum()))
    assert s["value"] == s["regions"]["scores near the threshold"] and s["error"] == pytest.approx(
        noise.sum() / signal.sum())
    # a box moved: its error relative to the half-extents of FP32's boxes
    moved = fp.copy()
    moved[:, 0, 1] += 2.0                                            # x of the 10 x 12 box: x1 and x2 2 px off
    b = m.steering(m.batch({"o": fp}, {"o": moved}, _batch()))
    half = sum(w ** 2 + h ** 2 for w, h in boxes[:, 2:]) / 2
    assert b["regions"]["boxes near the threshold"] == pytest.approx(10 * np.log10(half / 8.0))
    assert b["value"] == b["regions"]["boxes near the threshold"] and b["regions"]["scores near the threshold"] == np.inf
    # no network scores any anchor near the threshold: no figure (the outputs' SQNR steers)
    none = _yolov8(lose_scores=True)
    assert m.steering(m.batch({"o": none}, {"o": none}, _batch())) is None


def test_the_detection_steering_figure_is_the_same_for_yolov5_scores():
    """For objectness x class layouts the score compared (and the band it is compared in) is the product, as the
    detections are scored: objectness o and class scores s / o give the figure of class scores s."""
    v8 = _yolov8(n_images=2, classes=1)
    q8 = v8.copy()
    q8[:, 4, 0] = 0.6
    obj = np.random.default_rng(1).uniform(0.5, 1.0, (2, 1, v8.shape[2]))

    def v5(a):
        return np.concatenate([a[:, :4], obj, a[:, 4:] / obj], 1).transpose(0, 2, 1)

    m = det.Detection(labels=False)
    a = m.steering(m.batch({"o": v8}, {"o": q8}, _batch(2)))
    b = m.steering(m.batch({"o": v5(v8)}, {"o": v5(q8)}, _batch(2)))
    assert a["value"] == pytest.approx(b["value"]) and np.isfinite(a["value"])


def test_the_yolov5_and_raw_yolox_layouts_decode_to_the_same_detections():
    v8 = _yolov8(n_images=2, classes=1)
    m8 = det.Detection(labels=False)
    ref = m8.batch({"o": v8}, {"o": v8}, _batch(2))
    # YOLOv5 / YOLOX decoded: [n, anchors, 5 + classes], score = objectness x class
    v5 = np.concatenate([v8[:, :4], np.ones_like(v8[:, 4:5]), v8[:, 4:]], 1).transpose(0, 2, 1)
    r5 = det.Detection(labels=False).batch({"o": v5}, {"o": v5}, _batch(2))
    assert [r["fp32"] for r in r5] == [r["fp32"] for r in ref] == [3, 3]
    # raw YOLOX at 64x64, strides 8, 16, 32: 64 + 16 + 4 anchors; an anchor's box from its cell and stride
    raw = np.zeros((1, 84, 6))
    raw[0, :, 2:4] = np.log(2.0)               # w = h = 2 strides
    raw[0, 9, 4:] = [0.9, 0.9]                  # anchor 9: stride 8, cell (x 1, y 1)
    raw[0, 9, :2] = 0.5
    boxes, score, cls = det.decode(raw, "yolox", 64, 64)
    np.testing.assert_allclose(boxes[0, 9], [12.0, 12.0, 16.0, 16.0])
    assert score[0, 9] == pytest.approx(0.81) and cls[0, 9] == 0
    np.testing.assert_allclose(boxes[0, 64 + 5], [16.0, 16.0, 32.0, 32.0])   # stride 16, cell (1, 1)
    with pytest.raises(ConfigError, match=r"evaluation.options.strides: strides \[8, 16\] give 80 anchors"):
        det.decode(raw, "yolox", 64, 64, (8, 16))
    with pytest.raises(ConfigError, match=r"evaluation.options.layout: output o \[2, 5, 5\]"):
        det.Detection().batch({"o": np.zeros((2, 5, 5))}, {"o": np.zeros((2, 5, 5))}, _batch(2))


def test_map_against_yolo_label_files(tmp_path):
    """Label files beside the images and in the Ultralytics images/ -> labels/ layout; an image without one holds
    no object; a polygon line is its bounding box; a bad line names the file and line."""
    boxes, cls = _image_boxes()
    lines = "\n".join(f"{c} {b[0] / 64} {b[1] / 64} {b[2] / 64} {b[3] / 64}" for b, c in zip(boxes, cls))
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    paths = [tmp_path / "a.png", tmp_path / "images" / "b.png", tmp_path / "c.png"]
    (tmp_path / "a.txt").write_text(lines + "\n")
    (tmp_path / "labels" / "b.txt").write_text(lines.replace(
        f"1 {30 / 64} {50 / 64} {16 / 64} {8 / 64}", f"1 {22 / 64} {46 / 64} {38 / 64} {46 / 64} {30 / 64} {54 / 64}"))
    assert det.label_file(paths[1]) == tmp_path / "labels" / "b.txt" and det.label_file(paths[2]) is None
    got, got_cls = det.read_labels(tmp_path / "labels" / "b.txt", 64, 64)
    np.testing.assert_allclose(got, det.xyxy(boxes), atol=1e-9)
    m = det.Detection()
    out = _yolov8(n_images=3)
    r = m.summarize(m.batch({"o": out}, {"o": out}, _batch(paths=paths)))
    # image c has no label file: its three detections are false positives, at the lowest ranks of each class
    assert r["labelled_images"] == 2 and r["objects"] == 6
    assert r["map50_fp32"] == r["map50_int8"] == pytest.approx(1.0) and r["map50_drop"] == 0.0
    lost = m.summarize(m.batch({"o": out}, {"o": _yolov8(n_images=3, lose_scores=True)}, _batch(paths=paths)))
    assert lost["map50_int8"] == 0.0 and lost["map50_drop"] == pytest.approx(1.0)
    assert "map50_drop" not in det.Detection(labels=False).summarize(det.Detection(labels=False).batch(
        {"o": out}, {"o": out}, _batch(paths=paths)))
    (tmp_path / "a.txt").write_text("0 0.5 0.5 0.1\n")
    with pytest.raises(DataError, match=r"a.txt:1: not a YOLO label line"):
        m.batch({"o": out}, {"o": out}, _batch(paths=paths))


# ------------------------------------------------------------------------------------------------ the user's metric
USER_METRIC = '''
import numpy as np


def same_best_class(fp32, int8, batch, first=4):
    """1 where the image's best-scoring class is the same in FP32 and INT8."""
    f, q = fp32["output0"], int8["output0"]
    return {"same_best_class": f[:, first:].max(2).argmax(1) == q[:, first:].max(2).argmax(1),
            "fp32_best_score": f[:, first:].max((1, 2))}


def broken(fp32, int8, batch):
    return {"x": [1.0 / 0.0]}


def short(fp32, int8, batch):
    return {"x": [1.0]}


class NoSummary:
    def batch(self, fp32, int8, batch):
        return 1
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A metric module beside a model repo's quantflow.toml (the build puts that folder on sys.path)."""
    name = f"repo_metric_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_METRIC)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_a_user_function_gives_per_image_values_averaged_over_the_images(user_module):
    m = TaskMetric(f"{user_module}:same_best_class", {})
    f = _yolov8(n_images=4).reshape(4, 7, 40).astype(np.float32)
    q = f.copy()
    q[1, 4:] = 0.05
    q[1, 6, 5] = 0.95                               # image 1: another best class
    records = [m.record({"output0": f[:2]}, {"output0": q[:2]}, _batch(2)),
               m.record({"output0": f[2:]}, {"output0": q[2:]}, _batch(2))]
    numbers = m.summarize(records)
    assert numbers["same_best_class"] == 0.75 and numbers["fp32_best_score"] == pytest.approx(0.9)
    assert m.defaults == {"min": {}, "max": {}}
    # options are keyword arguments
    assert TaskMetric(f"{user_module}:same_best_class", {"first": 5}).record(
        {"output0": f}, {"output0": f}, _batch())["same_best_class"].tolist() == [1.0] * 4


def test_a_user_metric_failing_is_a_clear_message(user_module, tmp_path):
    with pytest.raises(QuantflowError, match=rf"evaluation.metric {user_module}:broken raised ZeroDivisionError: "
                                             rf".* \(at {tmp_path}.*\.py:\d+, on the batch from img0.png\)"):
        TaskMetric(f"{user_module}:broken", {}).record({}, {}, _batch())
    with pytest.raises(QuantflowError, match=r"'x' has 1 value\(s\) for a batch of 4 images"):
        TaskMetric(f"{user_module}:short", {}).record({}, {}, _batch())
    with pytest.raises(ConfigError, match=r"class .*NoSummary lacks method\(s\) summarize"):
        TaskMetric(f"{user_module}:NoSummary", {})
    with pytest.raises(ConfigError, match=r"evaluation.metric = 'nowhere_at_all:f': cannot import module 'nowhere_at_all'"):
        TaskMetric("nowhere_at_all:f", {})
    with pytest.raises(ConfigError, match=r"evaluation.options.nms: unknown key"):
        TaskMetric("detection", {"nms": 0.5})
    with pytest.raises(ConfigError, match=r"evaluation.options: .*NoSummary does not take \['k'\]"):
        TaskMetric(f"{user_module}:NoSummary", {"k": 1})


def test_the_gate_limits_the_numbers_the_metric_returns():
    class Limits:
        metric = "m:f"
        min = {"f1": 0.95}
        max = {}
    numbers = {"f1": 0.93, "map50_drop": 0.002, "recall": None}
    checks = judge(numbers, Limits, det.Detection.limits)
    assert checks == [{"number": "f1", "kind": "min", "limit": 0.95, "value": 0.93, "passed": False},
                      {"number": "map50_drop", "kind": "max", "limit": 0.01, "value": 0.002, "passed": True}]
    # a default limit on a number not returned (no labels: no mAP) is left out; a configured one is an error
    assert [c["number"] for c in judge({"f1": 0.99}, Limits, det.Detection.limits)] == ["f1"]
    Limits.min = {"recall": 0.9}
    assert judge(numbers, Limits, {})[0]["passed"] is False      # not measured: fails
    Limits.min = {"nope": 1.0}
    with pytest.raises(ConfigError, match=r"evaluation.min.nope: evaluation.metric m:f returns no number 'nope' "
                                          r"\(it returns: f1, map50_drop, recall\)"):
        judge(numbers, Limits, {})


# ------------------------------------------------------------------------------------------------ settings
def _config(**evaluation) -> dict:
    return {"model": {"onnx": "m.onnx", "input_shape": [1, 3, 32, 32]},
            "normalization": {"mean": [0, 0, 0], "std": [1, 1, 1], "scale": "0-1", "channel_order": "RGB"},
            "calibration": {"data_dir": "c", "count": 4}, "aipp": {"template": "static_rgb888_u8.cfg"},
            "evaluation": {"data_dir": "e", **evaluation}}


@pytest.mark.parametrize("evaluation,says", [
    ({"metric": "map"}, r'evaluation.metric: .*must be "top1", "outputs", "detection", .*"segmentation" or "module:callable"'),
    ({"metric": "mod:"}, r"evaluation.metric: .*must look like 'package.module:callable'"),
    ({"metric": "outputs", "min": {"f1": 0.9}}, r"evaluation.min belongs to a task metric"),
    ({"metric": "outputs", "options": {"a": 1}}, r"evaluation.options belongs to a task metric"),
    ({"metric": "mypkg.m:f"}, r"evaluation.min / evaluation.max: give the limits of the numbers mypkg.m:f returns"),
    ({"metric": "detection", "options": {"score_threshold": 1.5}}, r"evaluation.options.score_threshold: Input "
                                                                     r"should be less than 1"),
    ({"metric": "detection", "options": {"iou": 0.5}}, r"evaluation.options.iou: unknown key \(the detection "
                                                        r"metric's options: output, layout"),
    ({"metric": "detection", "options": {"layout": "yolov9"}}, r"evaluation.options.layout: Input should be"),
    ({"metric": "outputs", "parts": {"boxes": {"slice": "0:4"}}}, r"evaluation.parts.boxes.axis: required"),
    ({"metric": "outputs", "parts": {"boxes": {"axis": 0, "slice": "0:4"}}}, r"evaluation.parts.boxes.axis: .*axis 0 "
                                                                             r"holds the images"),
    ({"metric": "outputs", "parts": {"boxes": {"axis": 1, "slice": "a"}}}, r"evaluation.parts.boxes.slice: .*must "
                                                                           r"be \"start:stop\""),
    ({"metric": "outputs", "parts": {"box es": {"axis": 1, "slice": "0:4"}}}, r"evaluation.parts: .*part name 'box es'"),
    ({"metric": "outputs", "parts": {"b": {"axis": 1, "slice": "0:4", "cos": 1}}}, r"evaluation.parts.b.cos: unknown"),
    ({"metric": "top1", "threshold": 0.01, "parts": {"b": {"axis": 1, "slice": "0:4"}}}, r"evaluation.parts: the "
                                                                                         r"top-1 gate"),
    ({"metric": "outputs", "tune_share": 1.0}, r"evaluation.tune_share: Input should be less than 1"),
])
def test_the_evaluation_settings_name_the_field_at_fault(evaluation, says):
    with pytest.raises(ConfigError, match=says):
        config_from_dict(_config(**evaluation))


def test_a_task_metric_in_toml():
    import tomllib
    text = textwrap.dedent("""
        [evaluation]
        metric = "detection"
        data_dir = "heldout"
        min = { f1 = 0.95 }
        max = { map50_drop = 0.02 }
        options = { layout = "yolox", score_threshold = 0.3 }
        parts.scores = { axis = -1, slice = "5:", min_cosine = 0.98 }
        """)
    e = config_from_dict({**_config(), **tomllib.loads(text)}).evaluation
    assert e.task and e.min == {"f1": 0.95} and e.options["layout"] == "yolox" and e.parts["scores"].axis == -1


# ------------------------------------------------------------------------------------------------ sharded runs
@pytest.fixture(scope="module")
def detector_run(tmp_path_factory):
    """The score-losing ONNX detector (support/yolo_onnx.py) calibrated, its AIPP config, its held-out set."""
    from support.yolo_onnx import SIZE, detector

    from quantflow.backends.aipp import aipp_values, parse, render
    from quantflow.data.images import load_images, preprocess
    from quantflow.evaluation.runs import held_out
    from quantflow.frontends.onnx_model import read_onnx
    from quantflow.quantization.calibrater import calibrate
    from quantflow.quantization.deploy import quantized_graph
    from quantflow.quantization.passes import fold_for_quantization

    graph = read_onnx(detector())
    folded = fold_for_quantization(graph)
    norm = ([0.0] * 3, [1.0] * 3, "0-1", "RGB")
    calib = sorted((REPO / "calib_data").glob("*/*.png"))[::10]
    qp = calibrate(folded, [preprocess(load_images(calib, 3, SIZE, SIZE), *norm)], "minmax")
    from quantflow import aipp_templates
    aipp = parse(render(aipp_templates.path("static_rgb888_u8.cfg"),
                        aipp_values((1, 3, SIZE, SIZE), *norm, "BGR")))
    held = tmp_path_factory.mktemp("held")
    import shutil
    for i, p in enumerate(sorted((REPO / "eval_data").glob("*/*.png"))[::9][:40]):
        shutil.copy2(p, held / f"f{i:02d}.png")
    ev = held_out(held, None, False, held, shape=(3, SIZE, SIZE), normalization=norm, frame_order="BGR",
                  batch_size=8)
    return ev, graph, quantized_graph(folded, qp), aipp, {graph.outputs[0]: "output0"}


def test_a_task_run_sharded_over_processes_equals_the_single_process_one(detector_run, user_module):
    from quantflow.evaluation.outputs import network_regions
    from quantflow.evaluation.task import task_run

    ev, graph, deploy, aipp, names = detector_run

    class Limits:
        parts = {"scores": __import__("quantflow.config", fromlist=["OutputPart"]).OutputPart(axis=1, slice="4:")}
        min_cosine = 0.99
    regions = network_regions(graph, Limits, gate_whole=False, names=names)
    for metric, options in ((f"{user_module}:same_best_class", {}), ("detection", {})):
        one = task_run(ev, graph, deploy, aipp, regions, metric, options, names)
        many = task_run(dataclasses.replace(ev, engine=EngineSection(workers=2)), graph, deploy, aipp, regions, metric,
                        options, names)
        assert one[0].shape == (40, 2, 5) and np.array_equal(one[0], many[0])
        m = TaskMetric(metric, options)
        assert m.summarize(one[1]) == m.summarize(many[1])
        # one record per evaluation batch of 8; the detection metric's one per image
        assert len(one[1]) == (40 if metric == "detection" else 5)
    numbers = TaskMetric("detection", {}).summarize(one[1])
    assert numbers["fp32_detections"] > 100 and numbers["f1"] < 0.5   # this INT8 model loses the class scores


def test_a_checker_reuses_its_first_fp32_outputs_and_gives_a_fresh_runs_numbers(detector_run, monkeypatch):
    """The second run with a ``Fp32Memo`` runs no FP32 (float_runner is never made) and gives, over one process
    or two, the numbers of a run without it; a memo whose images do not fit ``MEMO_BYTES`` keeps nothing."""
    from quantflow.evaluation import runs
    from quantflow.evaluation.runs import Fp32Memo, output_stats, whole_outputs
    from quantflow.evaluation.task import task_run

    ev, graph, deploy, aipp, names = detector_run
    regions = whole_outputs(graph, names)
    fresh = task_run(ev, graph, deploy, aipp, regions, "detection", {}, names)
    memo = Fp32Memo(graph, len(ev))
    first = task_run(ev, graph, deploy, aipp, regions, "detection", {}, names, memo)
    assert {p for batch in memo.outputs for p in batch} == set(ev.paths)   # whole batches, every image

    def no_fp32(*a, **k):
        raise AssertionError("FP32 ran again")
    monkeypatch.setattr(runs, "float_runner", no_fp32)
    for e in (ev, dataclasses.replace(ev, engine=EngineSection(workers=2))):
        again = task_run(e, graph, deploy, aipp, regions, "detection", {}, names, memo)
        assert np.array_equal(again[0], fresh[0]) and np.array_equal(first[0], fresh[0])
        assert TaskMetric("detection", {}).summarize(again[1]) == TaskMetric("detection", {}).summarize(fresh[1])
        assert np.array_equal(output_stats(e, graph, deploy, aipp, regions, names, memo), fresh[0])
    monkeypatch.setattr(runs, "MEMO_BYTES", 10)
    assert not Fp32Memo(graph, len(ev)).fits


def test_the_readme_ocr_metric_reads_ctc_as_written(tmp_path, monkeypatch):
    """The text-recognition metric of docs/detectors.md: run as written, from a module beside the config."""
    readme = (REPO / "docs" / "detectors.md").read_text()
    start = readme.index("    # text_metric.py, beside quantflow.toml")
    block = readme[start:readme.index("\n\n    [evaluation]", start)]
    (tmp_path / "text_metric.py").write_text(textwrap.dedent(block))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("text_metric", None)
    # 3 lines, 6 time steps, symbols 0 (blank) .. 4: FP32 reads "1 2 2 3" (a blank between the 2s), "4 4 1", "3 2"
    steps = [[1, 1, 2, 0, 2, 3], [4, 0, 0, 4, 4, 1], [3, 3, 3, 0, 0, 2]]
    f = np.eye(5)[steps]
    q = f.copy()
    q[1, 1:3] = np.eye(5)[4]                                # line 1: the blanks between the 4s lost -> "4 1"
    q[2, 4] = np.eye(5)[2]                                  # line 2: a repeat merged -> the same "3 2"
    m = TaskMetric("text_metric:same_text", {"blank": 0})
    numbers = m.summarize([m.record({"out": f}, {"out": q}, _batch(3))])
    assert numbers == {"same_text": pytest.approx(2 / 3)}
    sys.modules.pop("text_metric", None)


def test_a_task_run_holds_one_batch_of_outputs_at_a_time(detector_run, tmp_path):
    """Over 4x the images a task run allocates (tracemalloc) about what it allocates over 1x: the outputs of one
    batch at a time, per image only the sums and the metric's small record."""
    import shutil
    import tracemalloc

    from quantflow.evaluation.runs import held_out, whole_outputs
    from quantflow.evaluation.task import task_run

    ev, graph, deploy, aipp, names = detector_run
    regions = whole_outputs(graph, names)
    peaks, numbers = {}, {}
    for n in (1, 4):
        folder = tmp_path / f"x{n}"
        folder.mkdir()
        for p in ev.paths:
            for k in range(n):
                shutil.copyfile(p, folder / f"{k}_{p.name}")
        big = held_out(folder, None, False, folder, shape=ev.shape, normalization=ev.normalization,
                       frame_order=ev.frame_order, batch_size=ev.batch_size)
        tracemalloc.start()
        try:
            stats, records = task_run(big, graph, deploy, aipp, regions, "detection", {"labels": False}, names)
            peaks[n] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        numbers[n] = TaskMetric("detection", {"labels": False}).summarize(records)
        assert len(stats) == n * len(ev) and len(records) == n * len(ev)   # one record per image
    assert numbers[4]["fp32_detections"] == 4 * numbers[1]["fp32_detections"]
    assert numbers[4]["f1"] == pytest.approx(numbers[1]["f1"])
    image_bytes = 3 * 32 * 32 * (1 + 4 + 2) + 7 * 64 * 4 * 2   # uint8, float32, AIPP float16; both outputs
    assert peaks[4] - peaks[1] < 0.1 * 3 * len(ev) * image_bytes, peaks


def test_a_number_not_measured_is_none_and_fails_its_limit():
    class Sums:
        def __init__(self):
            pass

        def batch(self, fp32, int8, batch):
            return len(batch.paths)

        def summarize(self, records):
            return {"images": sum(records), "rate": float("nan"), "ratio": None}

    import types
    module = types.ModuleType("sums_metric_for_test")
    module.Sums = Sums
    sys.modules["sums_metric_for_test"] = module
    try:
        m = TaskMetric("sums_metric_for_test:Sums", {})
        numbers = m.summarize([m.record({}, {}, _batch(3)), m.record({}, {}, _batch(2))])
    finally:
        sys.modules.pop("sums_metric_for_test")
    assert numbers == {"images": 5.0, "rate": None, "ratio": None} and not m.per_image

    class Limits:
        metric = "sums_metric_for_test:Sums"
        min = {"rate": 0.5}
        max = {"images": 10}
    assert [(c["number"], c["passed"]) for c in judge(numbers, Limits, {})] == [("rate", False), ("images", True)]
