"""Ops outside standard ONNX (issue 44): MediaPipe's Convolution2DTransposeBias as tf2onnx leaves it, read as a
transposed convolution with bias and checked against MediaPipe's kernel written out in NumPy (and against what the
graph stage's onnxruntime reference runs); any other op refused naming the op, its domain and the fix."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantflow.engine.runner import float_runner
from quantflow.errors import UnsupportedNetworkError
from quantflow.frontends.onnx_model import read_onnx
from quantflow.frontends.source import onnxruntime_outputs


def mediapipe_transpose_conv_bias(x, w, b, stride, same):
    """MediaPipe's kernel (mediapipe/util/tflite/operations/transpose_conv_bias.cc) on NHWC ``x`` and an OHWI
    weight, loop by loop."""
    n, h, wd, _ = x.shape
    cout, kh, kw, _ = w.shape
    ph = max(0, kh - (h - 1) % stride - 1) if same else 0
    pw = max(0, kw - (wd - 1) % stride - 1) if same else 0
    out = np.broadcast_to(b, (n, stride * (h - 1) + kh - ph, stride * (wd - 1) + kw - pw, cout)).astype(np.float64)
    for i in range(h):
        for j in range(wd):
            for fy in range(kh):
                for fx in range(kw):
                    y, xx = i * stride - ph // 2 + fy, j * stride - pw // 2 + fx
                    if 0 <= y < out.shape[1] and 0 <= xx < out.shape[2]:
                        out[:, y, xx, :] += x[:, i, j, :].astype(np.float64) @ w[:, fy, fx, :].T.astype(np.float64)
    return out.astype(np.float32)


def leftover_model(stride, same, in_hw=(5, 7), kernel=(3, 3), domain="", declare="output", seed=0, cin=8):
    """NCHW input -> NHWC -> the leftover (no attributes, as tf2onnx writes it) -> NCHW, with the output shape
    declared on the graph output, on the op's own value (``--custom-ops``), or nowhere."""
    rng = np.random.default_rng(seed)
    cout = 4
    w = rng.normal(size=(cout, *kernel, cin)).astype(np.float32) * 0.3
    b = rng.normal(size=cout).astype(np.float32)
    ph = max(0, kernel[0] - (in_hw[0] - 1) % stride - 1) if same else 0
    pw = max(0, kernel[1] - (in_hw[1] - 1) % stride - 1) if same else 0
    out_hw = (stride * (in_hw[0] - 1) + kernel[0] - ph, stride * (in_hw[1] - 1) + kernel[1] - pw)
    nodes = [helper.make_node("Transpose", ["input"], ["nhwc"], name="to_nhwc", perm=[0, 2, 3, 1]),
             helper.make_node("TFL_Convolution2DTransposeBias", ["nhwc", "w", "b"], ["up"], name="up", domain=domain),
             helper.make_node("Transpose", ["up"], ["y"], name="to_nchw", perm=[0, 3, 1, 2])]
    out_shape = [1, cout, *out_hw] if declare == "output" else None
    graph = helper.make_graph(nodes, "tflite", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                              [1, cin, *in_hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    if declare == "op":
        graph.value_info.append(helper.make_tensor_value_info("up", TensorProto.FLOAT, [1, *out_hw, cout]))
    opsets = [helper.make_opsetid("", 13)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets), w, b


@pytest.mark.parametrize("stride, same, in_hw, kernel", [(2, True, (5, 7), (3, 3)), (2, True, (4, 6), (2, 2)),
                                                         (2, False, (5, 7), (3, 3)), (3, True, (4, 5), (4, 3))])
def test_mediapipe_transposed_convolution_with_bias_is_read_as_mediapipe_computes_it(stride, same, in_hw, kernel,
                                                                                     tmp_path):
    model, w, b = leftover_model(stride, same, in_hw, kernel)
    onnx.save(model, tmp_path / "m.onnx")
    graph = read_onnx(tmp_path / "m.onnx")
    assert {"Conv2DTranspose", "BiasAdd"} <= set(graph.op_counts()), graph.op_counts()
    x = np.random.default_rng(1).normal(size=(3, 8, *in_hw)).astype(np.float32)
    want = mediapipe_transpose_conv_bias(x.transpose(0, 2, 3, 1), w, b, stride, same).transpose(0, 3, 1, 2)
    got = float_runner(graph).run(x)[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    reference = onnxruntime_outputs(tmp_path / "m.onnx", x, 1)   # what the graph stage checks the IR against
    np.testing.assert_allclose(reference, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_in_a_custom_domain_its_declared_output_shape_gives_the_stride():
    """tf2onnx --custom-ops puts the op in a domain and declares its output shape."""
    model, w, b = leftover_model(2, True, domain="mediapipe", declare="op")
    graph = read_onnx(model)
    x = np.random.default_rng(2).normal(size=(1, 8, 5, 7)).astype(np.float32)
    want = mediapipe_transpose_conv_bias(x.transpose(0, 2, 3, 1), w, b, 2, True).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(float_runner(graph).run(x)[graph.outputs[0]], want, rtol=1e-5, atol=1e-4)


def test_without_a_shape_to_read_its_stride_from_it_is_refused_with_the_fix():
    model, _, _ = leftover_model(2, True, declare=None)
    with pytest.raises(UnsupportedNetworkError, match=r"ONNX node up \(ai.onnx:TFL_Convolution2DTransposeBias, "
                                                      r"MediaPipe's transposed convolution with bias\).*stride.*"
                                                      r"--custom-ops TFL_Convolution2DTransposeBias:mediapipe"):
        read_onnx(model)


def unknown_op_model(op_type: str, domain: str, opset: int = 17) -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["input"], ["r"], name="relu"),
             helper.make_node(op_type, ["r"], ["y"], name="odd", domain=domain)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])])
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets)


@pytest.mark.parametrize("op_type, domain, opset, said", [
    ("TFL_MaxPoolingWithArgmax2D", "", 17, r"\(domain ai.onnx, the default\) at node odd.*Fix: tf2onnx left the TFLite "
                                           r"op MaxPoolingWithArgmax2D unconverted"),
    ("FusedConv", "com.microsoft", 17, r"\(domain 'com.microsoft'\) at node odd.*Fix: it is an onnxruntime contrib op"),
    ("MyPlugin", "acme.ops", 17, r"\(domain 'acme.ops'\) at node odd.*Fix: it is a custom op of domain 'acme.ops'"),
    ("HardSwish", "", 13, r"\(domain ai.onnx, the default\).*Fix: ONNX defines HardSwish from opset 14 "
                          r"on, and the model imports opset 13"),
    ("Hardmax", "", 17, r"\(domain ai.onnx, the default\).*Fix: re-export the model with that part written "
                        r"in the ops listed"),
])
def test_an_unknown_op_is_refused_naming_the_op_its_domain_and_the_fix(op_type, domain, opset, said):
    with pytest.raises(UnsupportedNetworkError, match=r"unsupported ONNX op '" + op_type + r"' " + said):
        read_onnx(unknown_op_model(op_type, domain, opset))


def test_a_custom_domain_tf2onnx_does_not_import_is_imported_for_the_rewrite(tmp_path):
    """tf2onnx 1.17's ``--custom-ops TFL_Convolution2DTransposeBias:mediapipe`` writes the node in domain mediapipe
    without an opset import for it (MediaPipe's selfie segmenter): ONNX's shape inference then refuses the model,
    so the rewrite imports it; the standard form imports only the domains its nodes use."""
    model, w, b = leftover_model(2, True, domain="mediapipe", declare="op")
    kept = [o for o in model.opset_import if o.domain != "mediapipe"]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    onnx.save(model, tmp_path / "m.onnx")
    graph = read_onnx(tmp_path / "m.onnx")
    assert {"Conv2DTranspose", "BiasAdd"} <= set(graph.op_counts())
    x = np.random.default_rng(2).normal(size=(1, 8, 5, 7)).astype(np.float32)
    want = mediapipe_transpose_conv_bias(x.transpose(0, 2, 3, 1), w, b, 2, True).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(onnxruntime_outputs(tmp_path / "m.onnx", x, 1), want, rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())


def test_another_unknown_op_beside_the_leftover_is_named_before_the_rewrite(tmp_path):
    """MediaPipe's selfie segmenter converted at opset 13 holds HardSwish (ONNX has it from opset 14) beside the
    leftover: the refusal names HardSwish and the opset to convert at, not the rewrite's missing shapes."""
    model, _, _ = leftover_model(2, True)
    model.graph.node.insert(1, helper.make_node("HardSwish", ["nhwc"], ["hs"], name="h_swish"))
    model.graph.node[2].input[0] = "hs"
    with pytest.raises(UnsupportedNetworkError, match=r"'HardSwish' \(domain ai.onnx\) at node h_swish.*opset 14"):
        read_onnx(model)
