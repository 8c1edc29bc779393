"""``quantflow init`` on an ONNX file onnxruntime cannot run (issue 44): it stops with onnxruntime's error, the
nodes outside standard ONNX (domain and op) and the fix, and writes no config; a converter's leftover with a
standard meaning runs in its standard form."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_onnx_custom import leftover_model, mediapipe_transpose_conv_bias

from quantflow.cli.main import main


def save(tmp_path, nodes, inits=(), opsets=(("", 17),)) -> str:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return str(path)


def onnxruntime_error(path: str) -> str:
    """onnxruntime's own error on the file, one line, as init quotes it."""
    with pytest.raises(Exception) as err:
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        sess.run(None, {"image": np.zeros((1, 3, 8, 8), np.float32)})
    return " ".join(str(err.value).split())


def init_fails(tmp_path, path: str, capsys) -> str:
    out = tmp_path / "quantflow.toml"
    assert main(["init", "--onnx", path, "--calib", str(tmp_path / "none"), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert not out.exists() and "Traceback" not in err
    return err


def test_custom_ops_stop_init_naming_each_domain_and_op_and_the_fix(tmp_path, capsys):
    path = save(tmp_path, [helper.make_node("Relu", ["image"], ["r"], name="relu"),
                           helper.make_node("MyPlugin", ["r"], ["p"], name="plugin", domain="acme.ops"),
                           helper.make_node("TFL_MaxPoolingWithArgmax2D", ["p"], ["y"], name="argmax")],
                opsets=(("", 17), ("acme.ops", 1)))
    err = init_fails(tmp_path, path, capsys)
    assert f"onnxruntime cannot run {path} at input shape [1, 3, 8, 8]: {onnxruntime_error(path)}" in err
    assert "acme.ops:MyPlugin x1 (first at node plugin)" in err
    assert "ai.onnx:TFL_MaxPoolingWithArgmax2D x1 (first at node argmax)" in err
    assert "it is a custom op of domain 'acme.ops': re-export the model with standard ONNX ops only" in err
    assert "tf2onnx left the TFLite op MaxPoolingWithArgmax2D unconverted" in err
    assert "classes" not in err


def test_a_standard_model_onnxruntime_refuses_stops_init_with_its_error(tmp_path, capsys):
    """A convolution whose weight reads 4 channels of a 3-channel input: standard ops, invalid all the same."""
    w = numpy_helper.from_array(np.ones((2, 4, 3, 3), np.float32), "w")
    path = save(tmp_path, [helper.make_node("Conv", ["image", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], [w])
    err = init_fails(tmp_path, path, capsys)
    assert f"onnxruntime cannot run {path} at input shape [1, 3, 8, 8]: {onnxruntime_error(path)}" in err
    assert "outside standard ONNX" not in err and "onnx.checker.check_model(path, full_check=True)" in err


def test_a_leftover_with_a_standard_meaning_runs_in_its_standard_form(tmp_path, capsys):
    model, w, b = leftover_model(2, True, in_hw=(5, 7), cin=3)
    onnx.save(model, tmp_path / "up.onnx")
    out = tmp_path / "quantflow.toml"
    assert main(["init", "--onnx", str(tmp_path / "up.onnx"), "--calib", str(tmp_path / "none"), "-o", str(out)]) == 0
    want = mediapipe_transpose_conv_bias(np.zeros((1, 5, 7, 3), np.float32), w, b, 2, True).transpose(0, 3, 1, 2)
    assert f"# the network ran at this shape: output {[list(want.shape)]}" in out.read_text()
