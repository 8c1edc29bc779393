"""benchmarks.peers: its figures against independent computations, its --set parsing, the project it writes, the
ONNX node names it gives NNCF for the graph IR's nodes, a two-input detector cut before its suppression (the FP32
run and NNCF's feeds), and the seeded images (benchmarks.synth)."""
from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper, version_converter
from scipy.spatial.distance import cosine as cosine_distance
from support.nms_onnx import ANCHORS, BOXES, CLASSES, SCORES, SIZE, nms_detector

from benchmarks import peers, synth


def test_cosine_is_one_minus_scipys_cosine_distance():
    rng = np.random.default_rng(0)
    f = rng.normal(size=(6, 4, 5)).astype(np.float32)
    q = f + rng.normal(0, 0.3, f.shape).astype(np.float32)
    got = peers.output_figures(f, q)["cosine"]
    assert got == pytest.approx(1 - cosine_distance(f.ravel().astype(np.float64), q.ravel().astype(np.float64)),
                                abs=1e-12)


@pytest.mark.parametrize("db", [5.0, 20.0, 41.5])
def test_sqnr_of_noise_scaled_to_a_known_ratio(db):
    rng = np.random.default_rng(1)
    f = rng.normal(size=(3, 50))
    e = rng.normal(size=f.shape)
    e *= np.sqrt(np.sum(f ** 2) / (np.sum(e ** 2) * 10 ** (db / 10)))   # noise energy = signal / 10^(db/10)
    assert peers.output_figures(f, f + e)["sqnr_db"] == pytest.approx(db, abs=1e-9)


def test_mean_abs_error_relative_to_the_peak():
    f = np.zeros((4, 10))
    f[2, 3] = -2.0                                    # max |FP32| = 2
    q = f + np.where(np.arange(40).reshape(4, 10) % 2, 0.1, -0.3)   # |error| 0.1 and 0.3, half each
    assert peers.output_figures(f, q)["rel_mean_abs"] == pytest.approx(0.2 / 2.0)


def test_identical_outputs():
    f = np.arange(12.0).reshape(3, 4)
    got = peers.output_figures(f, f.copy())
    assert got["cosine"] == pytest.approx(1.0) and got["sqnr_db"] == float("inf") and got["rel_mean_abs"] == 0.0


def test_top1_agreement_counts_images_with_the_same_top_class():
    fp = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7], [0.5, 0.4]])
    q = np.array([[0.8, 0.2], [0.6, 0.4], [0.4, 0.6], [0.1, 0.9], [0.7, 0.1]])  # images 1 and 2 differ
    assert peers.top1_agreement(fp, q) == pytest.approx(3 / 5)
    got = peers.figures({"p": fp}, {"p": q}, classifier=True)["p"]
    assert got["top1_agreement"] == pytest.approx(3 / 5) and "cosine" in got
    assert "top1_agreement" not in peers.figures({"p": fp}, {"p": q}, classifier=False)["p"]


def test_set_values_are_toml_and_reach_the_project():
    sets = [peers.parse_set('quantization.recover="auto"'), peers.parse_set("quantization.max_fallback=1"),
            peers.parse_set('quantization.skip=["a", "b"]'), peers.parse_set("calibration.method=minmax")]
    assert sets == [("quantization", "recover", "auto"), ("quantization", "max_fallback", 1),
                    ("quantization", "skip", ["a", "b"]), ("calibration", "method", "minmax")]
    conf = tomllib.loads(peers.project_toml("m", peers.MODELS["ppocr_cls"], sets, calib=5))
    assert conf["quantization"] == {"fallback": "off", "recover": "auto", "max_fallback": 1, "skip": ["a", "b"]}
    assert conf["calibration"]["method"] == "minmax" and conf["calibration"]["count"] == 5
    assert conf["normalization"]["mean"] == peers.HALF[0]
    with pytest.raises(SystemExit, match="section.key=value"):
        peers.parse_set("recover=auto")


def _opset11_convs(path):
    """Conv -> Relu -> Conv at opset 11, the second node unnamed."""
    w1 = numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w1")
    w2 = numpy_helper.from_array(np.ones((2, 4, 1, 1), np.float32), "w2")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w1"], ["a"], name="first"),
                           helper.make_node("Relu", ["a"], ["b"]),
                           helper.make_node("Conv", ["b", "w2"], ["y"], name="second")], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 4, 4])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2, 4, 4])], [w1, w2])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)]), str(path))


def test_ir_nodes_are_found_by_position_in_the_converted_file(tmp_path):
    _opset11_convs(tmp_path / "m.onnx")
    src, opset = peers.at_opset(tmp_path / "m.onnx", tmp_path / "m13.onnx")
    assert opset == 11 and src == tmp_path / "m13.onnx"
    assert onnx.load(str(src)).opset_import[0].version == peers.NNCF_OPSET
    # the IR names ONNX node k "v<k>" (and a second IR node of it "v<k>_bias"); v9 is not in the file
    assert peers.onnx_node_names(tmp_path / "m.onnx", src, ["v2", "v0_bias", "v9"]) == ["second", "first"]
    again = version_converter.convert_version(onnx.load(str(src)), peers.NNCF_OPSET)
    assert [n.name for n in again.graph.node if n.op_type == "Conv"] == ["first", "second"]


def test_a_model_at_opset_13_or_later_is_used_as_it_is(tmp_path):
    _opset11_convs(tmp_path / "m.onnx")
    m = onnx.load(str(tmp_path / "m.onnx"))
    m.opset_import[0].version = 13
    onnx.save(m, str(tmp_path / "m13.onnx"))
    assert peers.at_opset(tmp_path / "m13.onnx", tmp_path / "out.onnx") == (tmp_path / "m13.onnx", 13)
    assert not (tmp_path / "out.onnx").exists()


@pytest.fixture
def lfw_stand_in(monkeypatch):
    """scikit-image's LFW crops (not a test dependency) stood in for by 200 seeded 25 x 25 patches in 0..1."""
    patches = np.random.default_rng(0).random((200, 25, 25))
    monkeypatch.setattr(synth, "_lfw_subset", lambda: patches)
    return patches


@pytest.fixture
def photo_stand_in(monkeypatch):
    """scikit-image's photographs (not a test dependency) stood in for by seeded images of their own sizes; the
    names asked for are kept."""
    asked = []

    def photo(name):
        asked.append(name)
        rng = np.random.default_rng(sum(map(ord, name)))
        return rng.integers(0, 256, (int(rng.integers(60, 120)), int(rng.integers(60, 120)), 3), np.uint8)

    monkeypatch.setattr(synth, "_photo", photo)
    return asked


@pytest.mark.parametrize("kind", synth.KINDS)
def test_images_are_seeded_and_at_the_size_asked(kind, tmp_path, lfw_stand_in, photo_stand_in):
    a = synth.draw(kind, 48, 64, np.random.default_rng(7))
    b = synth.draw(kind, 48, 64, np.random.default_rng(7))
    c = synth.draw(kind, 48, 64, np.random.default_rng(8))
    assert a.shape == (48, 64, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_face_images_hold_out_their_own_faces(lfw_stand_in):
    assert synth.held_out("faces") == "faces_held_out" and synth.held_out("shapes") == "shapes"
    (faces0, others0), (faces1, others1) = synth.lfw_half(0), synth.lfw_half(1)
    assert len(faces0) == len(faces1) == len(others0) == len(others1) == 50
    # faces are the first 100 crops, non-faces the rest; no crop is in both halves
    assert np.array_equal(np.concatenate([faces0, faces1]), lfw_stand_in[:100])
    assert np.array_equal(np.concatenate([others0, others1]), lfw_stand_in[100:])
    # a face is pasted onto the shapes the same rng would draw
    plain = synth.shapes(np.random.default_rng(3), 64, 64)
    assert not np.array_equal(synth.draw("faces", 64, 64, np.random.default_rng(3)), plain)


def test_scene_images_hold_out_their_own_photographs(lfw_stand_in, photo_stand_in):
    assert synth.held_out("scenes") == "scenes_held_out"
    assert not set(synth.SCENE_PHOTOS[0]) & set(synth.SCENE_PHOTOS[1])
    for k in range(20):
        synth.draw("scenes", 64, 64, np.random.default_rng(k))
    assert set(photo_stand_in) <= set(synth.SCENE_PHOTOS[0])
    photo_stand_in.clear()
    for k in range(20):
        synth.draw("scenes_held_out", 64, 64, np.random.default_rng(k))
    assert set(photo_stand_in) <= set(synth.SCENE_PHOTOS[1]) and photo_stand_in


def test_a_project_draws_its_held_out_images_as_the_held_out_kind(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(synth, "write_images", lambda folder, kind, *a, **k: drawn.append((Path(folder).name, kind)))
    monkeypatch.setattr(peers, "model_file", lambda m, *a: tmp_path / "m.onnx")
    _opset11_convs(tmp_path / "m.onnx")
    m = dataclasses.replace(peers.MODELS["yolov8n_nudenet"], kind="faces")
    peers.write_project("yolov8n_nudenet", m, tmp_path / "p", [], 2, 2)
    assert drawn == [("calib", "faces"), ("eval", "faces_held_out")]


def test_static_shapes_fix_the_input_and_infer_the_values(tmp_path):
    _opset11_convs(tmp_path / "m.onnx")
    m = onnx.load(str(tmp_path / "m.onnx"))
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"   # a dynamic batch, as exporters write it
    onnx.save(m, str(tmp_path / "dyn.onnx"))
    out = peers.with_static_shapes(tmp_path / "dyn.onnx", tmp_path / "s.onnx", [1, 3, 4, 4])
    g = onnx.load(str(out)).graph
    assert [d.dim_value for d in g.input[0].type.tensor_type.shape.dim] == [1, 3, 4, 4]
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in g.value_info}
    assert shapes["a"] == [1, 4, 4, 4] and shapes["b"] == [1, 4, 4, 4]


def test_cached_outputs_are_read_back_under_the_same_key_only(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"a/b": np.arange(3.0) + len(calls)}

    first = peers.cached(tmp_path / "c.npz", "k1", compute)
    again = peers.cached(tmp_path / "c.npz", "k1", compute)
    other = peers.cached(tmp_path / "c.npz", "k2", compute)
    assert len(calls) == 2 and np.array_equal(first["a/b"], again["a/b"])
    assert np.array_equal(other["a/b"], np.arange(3.0) + 2)


def test_top1_agreement_of_a_sequence_output_is_per_time_step():
    rng = np.random.default_rng(3)
    fp = rng.random((2, 5, 7))
    q = fp.copy()
    q[0, 1] = fp[0, 1][::-1]                 # one step's scores reversed: its top symbol changes
    expected = np.mean([[np.argmax(fp[i, t]) == np.argmax(q[i, t]) for t in range(5)] for i in range(2)])
    assert peers.top1_agreement(fp, q) == pytest.approx(expected) == pytest.approx(9 / 10)


def test_parts_are_measured_on_their_elements_alone():
    rng = np.random.default_rng(4)
    fp = {"out": rng.normal(size=(3, 6, 10))}
    q = {"out": fp["out"] + rng.normal(0, 0.1, (3, 6, 10))}
    got = peers.figures(fp, q, False, (("out", "boxes", 1, 0, 4), ("out", "scores", 1, 4, 6)))
    assert set(got) == {"out", "out boxes", "out scores"}
    assert got["out scores"] == peers.output_figures(fp["out"][:, 4:6], q["out"][:, 4:6])
    assert got["out boxes"] == peers.output_figures(fp["out"][:, :4], q["out"][:, :4])


def test_the_table_names_images_drawn_as_another_kind():
    fig = {"cosine": 0.99, "sqnr_db": 20.0, "rel_mean_abs": 0.01}
    row = {"model": "yolov8n_nudenet", "calibration_images": 2, "held_out_images": 2, "device_float16": [],
           "quantflow": {"o": fig}, "nncf": {"o": {**fig, "sqnr_db": 18.0}}}
    own, faces = peers.format_table([{**row, "images": "shapes"}, {**row, "images": "faces"}]).splitlines()[2:4]
    assert own.startswith("| yolov8n_nudenet | o |") and faces.startswith("| yolov8n_nudenet (faces) | o |")
    assert faces.endswith("| quantflow (+2.0 dB) |")


def test_a_one_channel_model_gets_a_gray_project_that_loads(tmp_path):
    from quantflow.config import config_from_dict

    m = peers.MODELS["crnn_ddddocr"]
    conf = tomllib.loads(peers.project_toml("crnn_ddddocr", m, [], calib=4))
    # ddddocr's own preprocessing: grayscale, pixels / 255, nothing else; AIPP fed grey frames
    assert conf["normalization"] == {"mean": [0.0], "std": [1.0], "scale": "0-1", "channel_order": "GRAY"}
    assert conf["aipp"] == {"template": "static_yuv400_u8.cfg", "input_channel_order": "GRAY"}
    assert conf["model"]["input_shape"] == [1, 1, 64, 160]
    config_from_dict(conf, root=tmp_path)   # a valid configuration (GRAY exactly for one input channel)
    colour = tomllib.loads(peers.project_toml("ppocr_cls", peers.MODELS["ppocr_cls"], []))
    assert colour["aipp"] == {"template": "static_rgb888_u8.cfg", "input_channel_order": "BGR"}


def test_captchas_are_dark_text_on_a_light_background_filling_the_width():
    rng = np.random.default_rng(5)
    for _ in range(20):
        grey = synth.draw("captcha", 64, 160, rng).astype(np.float32).mean(-1)
        ink = grey < 200
        # a light background (ImageCaptcha's 238-255, smoothed), text of 4-6 characters spread along the width
        assert np.median(grey) > 225 and 0.03 < ink.mean() < 0.5
        columns = np.flatnonzero(ink[16:48].any(0))
        assert columns.max() - columns.min() > 60


def test_a_detector_with_a_second_input_and_a_cut_gets_a_project_that_loads(tmp_path):
    from quantflow.config import config_from_dict

    m = peers.MODELS["picodet_coco"]
    text = peers.project_toml("picodet_coco", m, [], calib=4)
    conf = tomllib.loads(text)
    assert conf["model"]["inputs"] == {"scale_factor": {"value": [1.0, 1.0]}}
    assert conf["model"]["outputs"] == ["Div.1", "Concat.9"]
    cfg = config_from_dict(conf, root=tmp_path)
    assert cfg.model.inputs["scale_factor"].value == [1.0, 1.0] and cfg.model.outputs == ("Div.1", "Concat.9")
    with pytest.raises(SystemExit, match="paddle_models"):
        peers.model_file(m, tmp_path)   # no onnx/picodet_s_416_coco.onnx there
    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / "picodet_s_416_coco.onnx").write_bytes(b"")
    assert peers.model_file(m, tmp_path) == tmp_path / "onnx" / "picodet_s_416_coco.onnx"


def _reference(model: onnx.ModelProto, x: np.ndarray, scale: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """BOXES and SCORES of the whole detector, made outputs besides its own and run image by image."""
    import onnxruntime as ort

    full = onnx.ModelProto()
    full.CopyFrom(model)
    full.graph.output.extend([helper.make_tensor_value_info(BOXES, onnx.TensorProto.FLOAT, None),
                              helper.make_tensor_value_info(SCORES, onnx.TensorProto.FLOAT, None)])
    sess = ort.InferenceSession(full.SerializeToString(), providers=["CPUExecutionProvider"])
    runs = [sess.run([BOXES, SCORES], {"image": x[i:i + 1], "scale_factor": np.array([scale], np.float32)})
            for i in range(len(x))]
    return np.concatenate([r[0] for r in runs]), np.concatenate([r[1] for r in runs])


def test_fp32_of_a_detector_cut_before_its_suppression_is_fed_its_second_input():
    model = nms_detector()
    x = np.random.default_rng(0).normal(size=(10, 3, SIZE, SIZE)).astype(np.float32)   # 8 + 2 images
    got = peers.ort_outputs(model.SerializeToString(), x, {"scale_factor": [2.0, 0.5]}, (BOXES, SCORES))
    assert list(got) == [BOXES, SCORES]
    assert got[BOXES].shape == (10, ANCHORS, 4) and got[SCORES].shape == (10, CLASSES, ANCHORS)
    boxes, scores = _reference(model, x, [2.0, 0.5])
    np.testing.assert_allclose(got[BOXES], boxes, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[SCORES], scores, rtol=1e-6, atol=1e-6)
    # the value reaches the boxes: scale_factor is (sy, sx), the boxes divided by (sx, sy, sx, sy)
    ones = peers.ort_outputs(model.SerializeToString(), x, {"scale_factor": [1.0, 1.0]}, (BOXES, SCORES))
    np.testing.assert_allclose(got[BOXES] * [0.5, 2.0, 0.5, 2.0], ones[BOXES], rtol=1e-5)
    with pytest.raises(SystemExit, match="every input but"):
        peers.ort_outputs(model.SerializeToString(), x, {}, (BOXES, SCORES))


def test_nncf_gets_the_cut_detector_with_static_shapes_and_both_inputs(tmp_path):
    model = nms_detector()
    onnx.save(model, str(tmp_path / "m.onnx"))
    cut = peers.cut_file(tmp_path / "m.onnx", tmp_path / "cut.onnx", (BOXES, SCORES))
    assert peers.cut_file(tmp_path / "m.onnx", tmp_path / "no.onnx", ()) == tmp_path / "m.onnx"
    g = onnx.load(str(cut)).graph
    assert [o.name for o in g.output] == [BOXES, SCORES] and "NonMaxSuppression" not in {n.op_type for n in g.node}
    static = peers.with_static_shapes(cut, tmp_path / "s.onnx", [1, 3, SIZE, SIZE], {"scale_factor": [1.0, 1.0]})
    m = onnx.load(str(static))
    dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in m.graph.input}
    assert dims == {"image": [1, 3, SIZE, SIZE], "scale_factor": [1, 2]}
    feed = peers.calibration_feeds(m, {"scale_factor": [1.0, 1.0]})(np.zeros((1, 3, SIZE, SIZE), np.float32))
    assert set(feed) == {"image", "scale_factor"}
    assert feed["scale_factor"].shape == (1, 2) and feed["scale_factor"].dtype == np.float32
