"""ONNX broadcasting in the reader (issue 44): every elementwise binary with operands of any broadcastable ranks
(lower rank on either side, 1-sized axes, scalars, two run-time tensors), PRelu with a slope of any broadcastable
rank (the input's full rank (1, C, 1, 1) as tf2onnx writes it, one varying over H / W), each against onnxruntime on
the same model; the float16 emulation against the deploy interpreter and the deploy MindIR read back."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from support import deploy_interpreter
from test_onnx_frontend import Net
from test_onnx_ops import images, model_of, ort_outputs, quantized

from quantflow.backends.deploy_mindspore import export_deploy_mindir
from quantflow.backends.deploy_onnx import check_deploy, deploy_model
from quantflow.engine.int8_emulator import Emulator
from quantflow.engine.runner import float_runner
from quantflow.errors import UnsupportedNetworkError
from quantflow.frontends.mindir import read_mindir
from quantflow.frontends.onnx_model import read_onnx
from quantflow.quantization.deploy import quantized_graph

SHAPE = (2, 3, 6, 6)   # the conv before each op makes (2, 8, 6, 6)


def assert_matches_onnxruntime(model, shape=SHAPE):
    graph = read_onnx(model)
    x = images(shape, 4)
    got = float_runner(graph).run(x)[graph.outputs[0]]
    want = np.concatenate([ort_outputs(model, x[s:s + shape[0]])[0] for s in range(0, len(x), shape[0])])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.nanmax(np.abs(want)), equal_nan=True)
    return graph


# the other operand's shape, and whether it comes first; `None` rows reshape the conv's output to (2, 8, 36)
OPERANDS = [((8, 1, 1), False), ((1, 8, 1, 1), True), ((6,), True), ((1, 1, 6, 1), False), ((), True),
            ((1, 6), False), ((2, 8, 6, 6), True), ((8, 6, 1), False)]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"])
@pytest.mark.parametrize("other, first", OPERANDS)
def test_an_elementwise_binary_broadcasts_a_constant_of_any_rank_as_onnxruntime(op, other, first):
    n = Net(40)
    x = n.conv("input", "c", 3, 8)
    if op == "Pow":   # a positive base: a fractional exponent of a negative number is NaN on both sides
        x = n.op("Sigmoid", [x])
    c = n.init("other", n.rng.uniform(0.5, 1.5, other).astype(np.float32))
    y = n.op(op, [c, x] if first else [x, c], "bin")
    graph = assert_matches_onnxruntime(model_of(n, [y], SHAPE))
    want = np.broadcast_shapes(other, (2, 8, 6, 6))
    assert graph.tensors[graph.outputs[0]].shape == want


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum"])
def test_two_run_time_operands_of_different_ranks_broadcast(op):
    """A pooled (2, 8, 1, 1) against the (2, 8, 6, 6) map, and a (6,) row computed from it against a (8, 6, 6)
    slice: lower ranks on either side, both computed at run time."""
    n = Net(41)
    x = n.conv("input", "c", 3, 8)
    pooled = n.op("ReduceMean", [x], axes=[2, 3], keepdims=1)
    row = n.op("ReduceMax", [x], axes=[0, 1, 2], keepdims=0)                                  # (6,)
    y = n.op(op, [pooled, x], "map")
    z = n.op(op, [row, n.op("Reshape", [y, n.const([2, 8, 6, 6])])], "row")
    assert_matches_onnxruntime(model_of(n, [z], SHAPE))


@pytest.mark.parametrize("slope, per_channel", [
    ((1, 8, 1, 1), True),      # the input's full rank, one per channel (tf2onnx's TFLite PReLU): issue 44
    ((8, 1, 1), True), ((1,), True), ((), True), ((2, 8, 1, 1), False),
    ((1, 8, 6, 6), False), ((1, 1, 6, 1), False), ((6,), False),   # varying over H / W: written out elementwise
])
def test_prelu_reads_a_slope_of_any_broadcastable_rank(slope, per_channel):
    n = Net(42)
    s = n.init("slope", n.rng.uniform(-0.5, 0.5, slope).astype(np.float32))
    y = n.op("PRelu", [n.conv("input", "c", 3, 8), s], "prelu")
    graph = assert_matches_onnxruntime(model_of(n, [y], SHAPE))
    assert ("PReLU" in graph.op_counts()) == per_channel, graph.op_counts()


def test_a_full_rank_constant_slope_becomes_one_value_per_channel():
    n = Net(43)
    values = n.rng.uniform(0, 0.5, 8).astype(np.float32)
    y = n.op("PRelu", [n.conv("input", "c", 3, 8), n.init("slope", values.reshape(1, 8, 1, 1))], "prelu")
    graph = read_onnx(model_of(n, [y], (1, 3, 6, 6)))
    prelu = next(node for node in graph.nodes if node.op == "PReLU")
    np.testing.assert_array_equal(graph.initializers[prelu.inputs[1]], values)


def unchecked(n: Net, y: str, opset: int) -> onnx.ModelProto:
    """``n`` with output ``y`` at ``opset``, not run through onnx's checker (``model_of`` does): the model is one the
    reader must refuse."""
    graph = helper.make_graph(n.nodes, "net", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)], n.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_a_slope_that_does_not_broadcast_is_refused_naming_both_shapes():
    n = Net(44)
    y = n.op("PRelu", [n.conv("input", "c", 3, 8), n.init("slope", np.ones((3,), np.float32))], "my_prelu")
    model = unchecked(n, y, 17)
    with pytest.raises(UnsupportedNetworkError, match=r"my_prelu .*slope of shape \(3,\) does not broadcast to the "
                                                      r"input's \(1, 8, 6, 6\).*re-export"):
        read_onnx(model)


def test_opset6_broadcast_from_an_axis_is_refused_with_the_conversion():
    n = Net(45)
    y = n.op("Add", [n.conv("input", "c", 3, 8), n.init("b", np.ones(8, np.float32))], "old_add", broadcast=1, axis=1)
    model = unchecked(n, y, 6)
    with pytest.raises(UnsupportedNetworkError, match=r"old_add .*opset-6 broadcasting of B \(8,\) from axis 1.*"
                                                      r"onnx.version_converter.convert_version"):
        read_onnx(model)


def broadcasting_net() -> onnx.ModelProto:
    n = Net(46)
    r = n.rng
    x = n.op("Relu", [n.conv("input", "c1", 3, 32)])                                         # (2, 32, 8, 8)
    x = n.op("PRelu", [x, n.init("s", r.uniform(0, .5, (1, 32, 1, 1)).astype(np.float32))], "prelu_full_rank")
    x = n.conv(x, "c2", 32, 32)
    x = n.op("Mul", [n.init("m", r.uniform(.5, 1.5, (8, 1)).astype(np.float32)), x], "mul_low_rank_first")
    x = n.op("Add", [x, n.init("a", r.uniform(-.5, .5, (1, 1, 8, 8)).astype(np.float32))], "add_hw")
    x = n.op("Sub", [n.init("z", np.float32(0.25)), x], "sub_scalar_first")
    x = n.op("Div", [x, n.init("d", r.uniform(1, 2, (1, 32, 1, 8)).astype(np.float32))], "div_cw")
    x = n.op("Max", [x, n.init("mx", r.uniform(-.2, 0, (8,)).astype(np.float32))], "max_w")
    x = n.op("Min", [n.init("mn", r.uniform(1, 2, (32, 8, 1)).astype(np.float32)), x], "min_ch")
    x = n.op("PRelu", [x, n.init("s2", r.uniform(0, .5, (1, 1, 8, 8)).astype(np.float32))], "prelu_hw")
    y = n.conv(x, "c3", 32, 32)
    y = n.op("Add", [y, n.op("ReduceMean", [y], axes=[2, 3], keepdims=1)], "add_pooled")
    return model_of(n, [y], (2, 3, 8, 8))


def test_broadcasts_through_the_emulation_the_deploy_graph_and_the_deploy_mindir(tmp_path):
    model = broadcasting_net()
    graph = assert_matches_onnxruntime(model, (2, 3, 8, 8))
    deploy = quantized_graph(*quantized(graph, (2, 3, 8, 8)))
    onnx_deploy = deploy_model(deploy, "x")
    check_deploy(onnx_deploy)
    x16 = images((2, 3, 8, 8), 2, seed=2).astype(np.float16)
    emulated = Emulator(deploy).outputs(x16)
    for o, got in zip(deploy.outputs, deploy_interpreter.run(onnx_deploy, x16)):
        np.testing.assert_array_equal(got, emulated[o])
    export_deploy_mindir(deploy, tmp_path)
    back = read_mindir(tmp_path / "deploy.mindir")
    again = Emulator(back).outputs(x16)
    for mine, theirs in zip(deploy.outputs, back.outputs):
        np.testing.assert_array_equal(again[theirs], emulated[mine])
