"""A detector exported with its suppression (PaddleDetection through paddle2onnx: ``image`` and ``scale_factor``
in, ``NonMaxSuppression`` at the end): the tail found, the model cut at its boxes and scores (``model.outputs``,
frontends/onnx_cut.py), read and checked against onnxruntime on the file cut the same way, gated by
``anchor_detection`` on decoded corners with classes-first scores, written so by ``quantflow init``, and built."""
from __future__ import annotations

import tomllib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.nms_onnx import ANCHORS, BOXES, CLASSES, IOU, NMS, SCORE, SCORES, SIZE, nms_detector
from support.project import init_onnx_project

import quantflow
from quantflow.config import load_config
from quantflow.engine.runner import float_runner
from quantflow.errors import UnsupportedNetworkError
from quantflow.evaluation.heads import recognise
from quantflow.evaluation.task import TaskMetric
from quantflow.frontends.onnx_cut import cut, suppression_tail
from quantflow.frontends.onnx_model import read_onnx
from quantflow.frontends.source import onnxruntime_outputs

SHAPE = (1, 3, SIZE, SIZE)
SCALE = [2.0, 0.5]   # sy, sx


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("nms") / "ppdet.onnx"
    onnx.save(nms_detector(), str(path))
    return path


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(1).random((4,) + SHAPE[1:], np.float32)


def _run(model: onnx.ModelProto, x, outputs=None):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(outputs, {"image": x, "scale_factor": np.asarray([SCALE], np.float32)})


def test_the_suppression_its_inputs_and_thresholds_are_found():
    tail = suppression_tail(nms_detector())
    assert (tail.node, tail.boxes, tail.scores) == (NMS, BOXES, SCORES)
    assert tail.iou == pytest.approx(IOU) and tail.score_threshold == pytest.approx(SCORE)
    plain = nms_detector()
    plain.graph.node.remove(next(n for n in plain.graph.node if n.op_type == "NonMaxSuppression"))
    assert suppression_tail(plain) is None


def test_the_cut_computes_the_tensors_the_file_computes(images):
    full = nms_detector()
    c = cut(full, [BOXES, SCORES], "ppdet.onnx")
    assert [o.name for o in c.graph.output] == [BOXES, SCORES]
    assert [i.name for i in c.graph.input] == ["image", "scale_factor"]
    assert not any(n.op_type in ("NonMaxSuppression", "Gather") for n in c.graph.node)
    onnx.checker.check_model(c, full_check=True)
    exposed = onnx.ModelProto()
    exposed.CopyFrom(full)
    exposed.graph.output.extend([helper.make_empty_tensor_value_info(BOXES),
                                 helper.make_empty_tensor_value_info(SCORES)])
    for x in images:
        got, want = _run(c, x[None]), _run(exposed, x[None], [BOXES, SCORES])
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    # an input only the suppression reads is left out
    only_boxes = cut(full, ["pixels"], "ppdet.onnx")
    assert [i.name for i in only_boxes.graph.input] == ["image"]


@pytest.mark.parametrize("name,said", [("scale_factor", "an input of the model"), ("bins", "a weight"),
                                       ("nothing", "no tensor of it")])
def test_a_cut_at_what_no_node_computes_is_refused_naming_it(name, said):
    with pytest.raises(UnsupportedNetworkError, match=f"model.outputs names '{name}', which is {said}"):
        cut(nms_detector(), [name], "ppdet.onnx")


def test_the_reader_refuses_the_suppression_naming_the_cut(model_file):
    with pytest.raises(UnsupportedNetworkError) as err:
        read_onnx(model_file, input_shape=SHAPE, extra_inputs={"scale_factor": SCALE})
    said = str(err.value)
    assert "'NonMaxSuppression'" in said and f'model.outputs = ["{BOXES}", "{SCORES}"]' in said


def test_the_cut_network_reads_and_matches_onnxruntime_on_the_file_cut_alike(model_file, images):
    g = read_onnx(model_file, input_shape=SHAPE, extra_inputs={"scale_factor": SCALE}, outputs=[BOXES, SCORES])
    assert len(g.outputs) == 2 and g.inputs == ["image", "scale_factor"]
    assert "MatMul" in g.op_counts()   # the integral over the bins: a MatMul by a vector, read as a one-column one
    ours = float_runner(g).run(images)
    first = onnxruntime_outputs(model_file, images, 1, fixed_inputs=g.fixed_inputs, outputs=[BOXES, SCORES])
    np.testing.assert_allclose(ours[g.outputs[0]], first, rtol=1e-5, atol=1e-4)
    want = _run(cut(nms_detector(), [BOXES, SCORES], "f"), images[:1])
    np.testing.assert_allclose(float_runner(g).run(images[:1])[g.outputs[1]], want[1], rtol=1e-5, atol=1e-6)


def test_a_matmul_by_a_vector_is_read_as_onnx_promotes_it():
    rng = np.random.default_rng(0)
    v = rng.normal(size=8).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "v"], ["y"])], "mv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 5])],
                              [numpy_helper.from_array(v, "v")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    g = read_onnx(m)
    x = rng.normal(size=(2, 3, 5, 8)).astype(np.float32)
    got = float_runner(g).run(x)[g.outputs[0]]
    np.testing.assert_allclose(got, x @ v, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ the head
def _corners(n, rng):
    lo = rng.uniform(0, 20, (1, n, 2))
    return np.concatenate([lo, lo + rng.uniform(1, 10, (1, n, 2))], -1)


def test_recognised_as_decoded_corners_with_the_classes_first():
    rng = np.random.default_rng(0)
    outputs = {BOXES: _corners(ANCHORS, rng), SCORES: rng.uniform(0, 1, (1, CLASSES, ANCHORS))}
    head = recognise(outputs, SHAPE)
    assert head.metric == "anchor_detection", head.what
    assert head.options == {"boxes": BOXES, "scores": SCORES, "activation": "none", "background": -1,
                            "class_axis": 1, "box_coder": "corners"}
    # box regressors scattered around zero are not corners: read per anchor as before
    raw = {BOXES: rng.normal(size=(1, ANCHORS, 4)), "s": rng.normal(size=(1, ANCHORS, 2))}
    assert recognise(raw, SHAPE).options.get("box_coder") == "exp"


def test_corners_are_suppressed_and_matched_and_changes_counted():
    """Three anchors, one class: FP32 finds a box twice (anchors 0 and 1, suppressed to one) and another at 2; INT8
    moves the second box off it and scores anchor 0 below the threshold."""
    o = {"boxes": "b", "scores": "s", "activation": "none", "background": -1, "class_axis": 1,
         "box_coder": "corners", "nms_iou": 0.5}
    m = TaskMetric("anchor_detection", o)
    fb = np.array([[[0, 0, 10, 10], [0, 0, 10, 9], [20, 20, 30, 30]]], np.float64)
    qb = fb.copy()
    qb[0, 2] = [26, 26, 36, 36]                       # IoU 16 / 184 with FP32's
    fs = np.array([[[0.9, 0.8, 0.7]]])                # [images, classes, anchors]
    qs = np.array([[[0.4, 0.8, 0.7]]])
    records = m.record({"b": fb, "s": fs}, {"b": qb, "s": qs}, _batch(1, 40, 40))
    assert (records[0]["fp32"], records[0]["int8"], records[0]["matched"]) == (2, 2, 1)
    assert m.summarize(records)["f1"] == pytest.approx(0.5)
    same = m.record({"b": fb, "s": fs}, {"b": fb, "s": fs}, _batch(1, 40, 40))
    assert m.summarize(same)["f1"] == 1.0 and m.summarize(same)["fp32_detections"] == 2


def _batch(n, h, w):
    from pathlib import Path

    from quantflow.evaluation.task import Batch
    paths = tuple(Path("/data") / f"{k}.png" for k in range(n))
    return Batch(paths, tuple(p.name for p in paths), np.zeros((n, h, w, 3), np.uint8))


# ------------------------------------------------------------------------------------------------ init, build
def _init(tmp_path):
    return init_onnx_project(tmp_path / "p", "ppdet.onnx", lambda path: onnx.save(nms_detector(), str(path)))


def test_init_cuts_at_the_suppression_and_gates_the_detections(tmp_path):
    out = _init(tmp_path)
    text = out.read_text()
    written = tomllib.loads(text)
    assert written["model"]["outputs"] == [BOXES, SCORES] and f"(node {NMS})" in text
    assert written["model"]["inputs"] == {"scale_factor": {"value": [1.0, 1.0]}}
    ev = written["evaluation"]
    assert ev["metric"] == "anchor_detection"
    assert ev["options"] == {"boxes": BOXES, "scores": SCORES, "activation": "none", "background": -1,
                             "class_axis": 1, "box_coder": "corners", "nms_iou": pytest.approx(IOU)}
    assert load_config(out).model.outputs == (BOXES, SCORES)


def test_model_outputs_is_for_onnx_files_only():
    from quantflow.config import ModelSection

    with pytest.raises(ValueError, match="model.outputs \\(a\\) applies to model.onnx only; model.mindir is read"):
        ModelSection(mindir="m.mindir", input_shape=[1, 3, 32, 32], outputs=["a"])


def test_a_detector_with_its_suppression_builds_as_init_writes_it(tmp_path):
    out = _init(tmp_path)
    r = quantflow.build(out)
    assert r.verdict == "PASS" and [f.id for f in r.figures if f.gated] == ["f1"]
    deploy = onnx.load(str(r.artifacts["deploy_onnx"]))
    assert [i.name for i in deploy.graph.input] == ["image", "scale_factor"]
    assert not any(n.op_type == "NonMaxSuppression" for n in deploy.graph.node)
    assert [list(d.dim_value for d in o.type.tensor_type.shape.dim) for o in deploy.graph.output] == \
        [[1, ANCHORS, 4], [1, CLASSES, ANCHORS]]
    assert r.report["distance"]["unit"] == "boxes"
