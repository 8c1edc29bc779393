"""Channels-last ONNX inputs (issue 44, item 1): a file whose input is N, H, W, C, as tf2onnx writes TFLite and Keras
models, builds as exported.  ``quantflow init`` writes ``model.input_layout = "NHWC"`` with an N, C, H, W
``input_shape``; the reader's IR takes N, C, H, W (a Transpose to N, H, W, C in front, cancelled against the
Transpose back that tf2onnx puts before the first convolution) and computes what onnxruntime computes on the file
fed N, H, W, C; a build passes its gate with a ``deploy.onnx`` whose input is N, C, H, W (what atc takes with
AIPP for an ONNX model)."""
from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.project import tiny_config, tiny_project

from quantflow.cli import main
from quantflow.config import load_config
from quantflow.engine.runner import float_runner
from quantflow.errors import ConfigError, UnsupportedNetworkError
from quantflow.frontends.onnx_model import read_onnx
from quantflow.frontends.source import onnxruntime_outputs

SIZE = 16


def _save(path: Path, nodes, inputs: list, output, weights: dict) -> Path:
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()]
    graph = helper.make_graph(nodes, "nhwc", [helper.make_tensor_value_info("input_1", TensorProto.FLOAT, inputs)],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def tf2onnx_classifier(path: Path, size: int = SIZE, classes: int = 10, batch="unk__0") -> Path:
    """As tf2onnx writes a Keras / TFLite classifier: the N, H, W, C input, a Transpose to N, C, H, W before the
    first convolution, convolutions (3 -> 24 channels, then 24 -> 24, INT8) with ReLU, global pooling and a Gemm."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Transpose", ["input_1"], ["nchw"], name="model/conv1/Conv2D__6", perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["nchw", "w1", "b1"], ["c1"], name="model/conv1/Conv2D", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="model/conv1/Relu"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="model/conv2/Conv2D", strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"], name="model/conv2/Relu"),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="model/pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="model/flatten"),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["Identity"], name="model/dense", transB=1)]
    weights = {"w1": rng.normal(0, 0.4, (24, 3, 3, 3)), "b1": rng.normal(0, 0.1, 24),
               "w2": rng.normal(0, 0.15, (24, 24, 2, 2)), "b2": rng.normal(0, 0.1, 24),
               "w3": rng.normal(0, 0.3, (classes, 24)), "b3": np.zeros(classes)}
    return _save(path, nodes, [batch, size, size, 3], "Identity", weights)


def nhwc_convolutions(path: Path) -> Path:
    """The input read in N, H, W, C (a per-channel scale and shift over its last axis, as a normalization layer
    converted from TensorFlow) and by a Transpose to the first convolution; each convolution between a Transpose to
    N, C, H, W and one back; the output N, H, W, C (a segmenter's)."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Mul", ["input_1", "scale"], ["scaled"], name="norm/mul"),
             helper.make_node("Add", ["scaled", "shift"], ["normed"], name="norm/add"),
             helper.make_node("Transpose", ["normed"], ["t1"], name="conv1/t_in", perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["t1", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c1"], ["c1_nhwc"], name="conv1/t_out", perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["input_1"], ["raw"], name="skip/t_in", perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["raw", "w2"], ["c2"], name="skip", pads=[0, 0, 0, 0]),
             helper.make_node("Transpose", ["c2"], ["c2_nhwc"], name="skip/t_out", perm=[0, 2, 3, 1]),
             helper.make_node("Add", ["c1_nhwc", "c2_nhwc"], ["sum"], name="merge"),
             helper.make_node("Relu", ["sum"], ["segment"], name="relu")]
    weights = {"scale": rng.uniform(0.5, 2.0, 3), "shift": rng.normal(0, 0.2, 3),
               "w1": rng.normal(0, 0.4, (20, 3, 3, 3)), "w2": rng.normal(0, 0.4, (20, 3, 1, 1))}
    return _save(path, nodes, [1, SIZE, SIZE, 3], "segment", weights)


def _images(folder: Path, n: int = 4, size: int = SIZE) -> Path:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for k in range(n):
        cv2.imwrite(str(folder / f"{k}.png"), rng.integers(0, 255, (size, size, 3)).astype(np.uint8))
    return folder


def _onnxruntime(path: Path, x: np.ndarray) -> np.ndarray:
    """onnxruntime on the file as given, fed N, H, W, C: the reference, computed here independently."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input_1": np.ascontiguousarray(x.transpose(0, 2, 3, 1))})[0]


# ----------------------------------------------------------------------------- the reader

@pytest.mark.parametrize("model", [tf2onnx_classifier, nhwc_convolutions])
def test_the_ir_takes_nchw_and_computes_what_onnxruntime_computes_on_the_file(tmp_path, model):
    path = model(tmp_path / "m.onnx")
    g = read_onnx(path, input_shape=(1, 3, SIZE, SIZE), input_layout="NHWC")
    assert g.inputs == ["input_1"] and g.tensors["input_1"].shape == (1, 3, SIZE, SIZE)
    x = np.random.default_rng(3).normal(0, 1, (1, 3, SIZE, SIZE)).astype(np.float32)
    got = float_runner(g).run(x)[g.outputs[0]]
    want = _onnxruntime(path, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the graph stage's reference (source.onnxruntime_outputs) feeds the file the same batch N, H, W, C
    np.testing.assert_allclose(onnxruntime_outputs(path, x, 1, "NHWC"), want, rtol=1e-6, atol=1e-6)


def test_mediapipes_transposed_convolution_reading_the_nhwc_input_is_read_as_mediapipe_computes_it(tmp_path):
    """tf2onnx's leftover of MediaPipe's Convolution2DTransposeBias (a segmenter's upsampling) reading the N, H, W, C
    input itself: rewritten in its standard form at the file's N, H, W, C shape, by the reader and for onnxruntime."""
    from test_onnx_custom import leftover_model, mediapipe_transpose_conv_bias

    model, w, b = leftover_model(2, True, (5, 7), (3, 3))
    g = model.graph
    del g.node[0]   # the input is N, H, W, C and the leftover reads it
    g.node[0].input[0] = "input"
    g.input[0].CopyFrom(helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 5, 7, 8]))
    onnx.save(model, tmp_path / "m.onnx")
    graph = read_onnx(tmp_path / "m.onnx", input_shape=(1, 8, 5, 7), input_layout="NHWC")
    x = np.random.default_rng(4).normal(size=(1, 8, 5, 7)).astype(np.float32)
    want = mediapipe_transpose_conv_bias(x.transpose(0, 2, 3, 1), w, b, 2, True).transpose(0, 3, 1, 2)
    got = float_runner(graph).run(x)[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    np.testing.assert_allclose(onnxruntime_outputs(tmp_path / "m.onnx", x, 1, "NHWC"), want, rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())


def test_tf2onnx_transpose_before_the_first_convolution_cancels_with_the_inserted_one(tmp_path):
    g = read_onnx(tf2onnx_classifier(tmp_path / "m.onnx"), input_shape=(1, 3, SIZE, SIZE), input_layout="NHWC")
    assert "Transpose" not in g.op_counts()
    assert g.nodes[0].op == "Conv2D" and g.nodes[0].inputs[0] == "input_1"


def test_an_input_read_in_nhwc_gets_a_transpose_to_nhwc_in_front(tmp_path):
    g = read_onnx(nhwc_convolutions(tmp_path / "m.onnx"), input_shape=(1, 3, SIZE, SIZE), input_layout="NHWC")
    first = g.nodes[0]
    assert first.op == "Transpose" and first.inputs == ["input_1"] and first.attrs["perm"] == [0, 2, 3, 1]
    assert g.tensors[first.outputs[0]].shape == (1, SIZE, SIZE, 3)
    # the skip branch's Transpose back to N, C, H, W is cancelled: its convolution reads the input itself
    skip = next(n for n in g.nodes if n.scope == "skip")
    assert skip.inputs[0] == "input_1"
    assert g.op_counts()["Transpose"] == 4   # the inserted one, conv1's pair, skip's way back to N, H, W, C


def test_a_channels_last_file_read_as_nchw_is_refused_naming_the_key(tmp_path):
    path = tf2onnx_classifier(tmp_path / "m.onnx", batch=1)
    with pytest.raises(UnsupportedNetworkError, match=r'input_1.*\[1, 16, 16, 3\].*model.input_layout = "NHWC"'):
        read_onnx(path, input_shape=(1, 3, SIZE, SIZE))


def test_an_nchw_file_read_as_nhwc_is_refused_naming_the_key(tmp_path):
    from support.project import tiny_onnx
    tiny_onnx(tmp_path / "m.onnx", size=SIZE)
    with pytest.raises(UnsupportedNetworkError, match=r'model.input_layout = "NCHW"'):
        read_onnx(tmp_path / "m.onnx", input_shape=(1, 3, SIZE, SIZE), input_layout="NHWC")


# ----------------------------------------------------------------------------- init and the configuration

@pytest.mark.parametrize("batch,dims", [("unk__0", None), (1, None), ("unk__0", ["unk__1", "unk__2"])],
                         ids=["dynamic-batch", "static", "dynamic-size"])
def test_init_writes_the_nhwc_layout_and_an_nchw_input_shape(tmp_path, batch, dims):
    path = tf2onnx_classifier(tmp_path / "m.onnx", batch=batch)
    if dims:   # height and width dynamic too: read off the calibration images
        model = onnx.load(str(path))
        shape = model.graph.input[0].type.tensor_type.shape
        shape.dim[1].dim_param, shape.dim[2].dim_param = dims
        onnx.save(model, str(path))
    out = tmp_path / "quantflow.toml"
    assert main(["init", "--onnx", str(path), "--calib", str(_images(tmp_path / "calib")),
                 "--eval", str(_images(tmp_path / "eval")), "-o", str(out)]) == 0
    cfg = load_config(out)
    assert cfg.model.input_layout == "NHWC" and cfg.model.input_shape == (1, 3, SIZE, SIZE)
    assert cfg.model.input_name == "input_1" and cfg.aipp.input_channel_order == "BGR"
    assert '# the file\'s input is [1, 16, 16, 3], N, H, W, C' in out.read_text()
    assert "outputs [[1, 10]]" in out.read_text()   # onnxruntime ran the file, fed N, H, W, C


def test_init_takes_input_shape_as_nchw_for_a_channels_last_file(tmp_path):
    from quantflow.scaffold import write

    dynamic = tf2onnx_classifier(tmp_path / "dynamic.onnx")
    model = onnx.load(str(dynamic))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[1].dim_param, dims[2].dim_param = "h", "w"
    onnx.save(model, str(dynamic))
    out, _ = write(tmp_path / "q.toml", calib=_images(tmp_path / "calib", size=24), eval=_images(tmp_path / "eval"),
                   onnx=dynamic, input_shape=[1, 3, 24, 24])
    cfg = load_config(out)
    assert cfg.model.input_shape == (1, 3, 24, 24) and cfg.model.input_layout == "NHWC"
    # a static N, H, W, C file: --input-shape is compared with its input read as N, C, H, W
    with pytest.raises(ConfigError, match=r"the model's input is \[1, 3, 16, 16\] \(its N, H, W, C input as N, C, H, "
                                          r"W\) \(dimension 2 is 16, dimension 3 is 16\)"):
        write(tmp_path / "q2.toml", calib=tmp_path / "calib", eval=tmp_path / "eval",
              onnx=tf2onnx_classifier(tmp_path / "static.onnx", batch=1), input_shape=[1, 3, 24, 24])


def test_init_leaves_an_nchw_file_without_the_key(tmp_path):
    from support.project import tiny_onnx
    tiny_onnx(tmp_path / "m.onnx", size=SIZE)
    out = tmp_path / "quantflow.toml"
    assert main(["init", "--onnx", str(tmp_path / "m.onnx"), "-o", str(out)]) == 0
    assert "input_layout" not in out.read_text() and load_config(out).model.input_layout == "NCHW"


@pytest.mark.parametrize("source", ['mindir = "net.mindir"', 'entry = "mypkg.net:build"\ncheckpoint = "n.ckpt"'],
                         ids=["mindir", "entry"])
def test_input_layout_nhwc_is_refused_for_a_mindspore_network_naming_the_file_and_field(tmp_path, source):
    path = tmp_path / "quantflow.toml"
    path.write_text(tiny_config().replace('onnx = "tiny.onnx"', source + '\ninput_layout = "NHWC"'))
    with pytest.raises(ConfigError, match=r"(?s)quantflow\.toml.*model.input_layout = 'NHWC' applies to model.onnx"):
        load_config(path)


# ----------------------------------------------------------------------------- a build (slow)

@pytest.mark.slow
def test_a_channels_last_model_builds_and_passes_its_gate_with_an_nchw_deploy_graph(tmp_path):
    import quantflow

    config = tiny_config().replace('input_name = "image"', 'input_name = "input_1"\ninput_layout = "NHWC"')
    project = tiny_project(tmp_path / "p", config)
    tf2onnx_classifier(project / "tiny.onnx", size=32)      # the demo's 32 x 32 images, its 10 classes
    r = quantflow.build(project / "quantflow.toml")
    assert r.passed and r.verdict == "PASS"
    graph = json.loads((r.artifacts["graph"] / "graph.json").read_text())
    assert graph["verify"]["reference"].startswith("onnxruntime") and graph["verify"]["relative_diff"] < 1e-4
    deploy = onnx.load(str(r.artifacts["deploy_onnx"]))
    (inp,) = deploy.graph.input
    assert inp.name == "input_1"
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim] == [1, 3, 32, 32]
    assert not any(n.op_type == "Transpose" for n in deploy.graph.node)   # tf2onnx's Transpose cancelled
    assert {"AscendQuant", "AscendDequant"} <= {n.op_type for n in deploy.graph.node}
