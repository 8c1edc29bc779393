"""MindIR -> graph IR: zoo-style graphs read, plumbing resolved, float output equal to MindSpore's."""
from __future__ import annotations

import re

import mindspore as ms
import numpy as np
import pytest
from quantflow.tasks.graph import verify_graph
from support import nets

from quantflow.engine.runner import float_runner
from quantflow.errors import UnsupportedNetworkError
from quantflow.frontends.mindir import read_mindir
from quantflow.frontends.source import mindspore_outputs
from quantflow.quantization.passes import fold_for_quantization

PLUMBING = {"Load", "Depend", "UpdateState", "MakeTuple", "TupleGetItem", "Constant"}
STYLES = {
    "ResNetStyle": {"Conv2D", "BatchNorm", "Add", "MaxPool", "AdaptiveAvgPool2D", "Flatten", "MatMul"},
    "MobileNetV3Style": {"HSwish", "HSigmoid", "ReduceMean", "Mul", "Add"},
    "DenseNetStyle": {"Concat", "AvgPool", "BatchNorm", "ReLU"},
    "ShuffleNetStyle": {"StridedSlice", "Transpose", "Reshape", "Split", "Concat"},
    "OpZoo": {"SiLU", "GeLU", "Sigmoid", "Maximum", "Minimum", "Softmax", "LayerNorm", "Sub", "Divs", "Pad",
              "ResizeNearestNeighbor", "Unstack", "Transpose", "BroadcastTo", "BatchMatMul", "AvgPool"},
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("mindir")
    out = {}
    for name in STYLES:
        net = getattr(nets, name)()
        out[name] = (net, nets.export(net, root / f"{name}.mindir"))
    return out


@pytest.mark.parametrize("name", list(STYLES))
def test_ir_output_equals_mindspore(exported, name):
    net, path = exported[name]
    graph = read_mindir(path)
    ops = set(graph.op_counts())
    assert STYLES[name] <= ops and not ops & PLUMBING
    x = np.random.default_rng(0).normal(size=(6, 3, 16, 16)).astype(np.float32)
    got = float_runner(graph).run(x)[graph.outputs[0]]
    ms.set_context(mode=ms.PYNATIVE_MODE)
    want = np.concatenate([net(ms.Tensor(x[i:i + 2])).asnumpy() for i in range(0, 6, 2)])
    assert got.shape == want.shape == (6, 10)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    folded = fold_for_quantization(graph)
    assert folded.op_counts().get("BatchNorm", 0) < graph.op_counts().get("BatchNorm", 1) or "BatchNorm" not in ops
    np.testing.assert_allclose(float_runner(folded).run(x)[folded.outputs[0]], want, rtol=1e-4,
                               atol=1e-4 * np.abs(want).max())


def test_nodes_keep_their_scopes_and_attributes_under_stable_names(exported, tmp_path):
    graph = read_mindir(exported["ResNetStyle"][1])
    convs = [n for n in graph.nodes if n.op == "Conv2D"]
    assert convs[0].scope.startswith("Default/stem") and re.fullmatch(r"v\d+", convs[0].name)
    assert all("." in n.inputs[1] and not n.inputs[1].startswith("v") for n in convs)  # parameter names kept
    # MindSpore's value names depend on what the process compiled before; the IR's do not
    ms.set_context(mode=ms.PYNATIVE_MODE)
    nets.ResidualNet()(ms.Tensor(np.zeros((2, 3, 16, 16), np.float32)))
    again = read_mindir(nets.export(exported["ResNetStyle"][0], tmp_path / "again.mindir"))
    assert [(n.name, n.inputs, n.outputs, n.scope) for n in again.nodes] == \
        [(n.name, n.inputs, n.outputs, n.scope) for n in graph.nodes]
    assert convs[0].attrs["strides"] == [2, 2] and convs[0].attrs["pads"] == [1, 1, 1, 1]
    pool = next(n for n in graph.nodes if n.op == "MaxPool")
    assert pool.attrs["kernel"] == [3, 3] and pool.attrs["pads"] == [0, 0, 1, 1]   # 'same' on 8x8, stride 2
    assert all(graph.initializers[n.inputs[1]].dtype == np.float32 for n in convs)


def test_constant_subgraphs_are_computed_once_and_tile_stack_run(tmp_path):
    """A YOLO-style anchor grid: Tile and Stack of constants and an int32 stride parameter times floats are
    computed when read (no node left for them); Tile and Stack on run-time tensors are IR ops; the IR equals
    MindSpore."""
    net = nets.AnchorDecode()
    graph = read_mindir(nets.export(net, tmp_path / "anchors.mindir"))
    ops = graph.op_counts()
    assert ops["Tile"] == 1 and ops["Stack"] == 1 and "Mul" not in ops   # the run-time ones; the grid is a constant
    grid = [v for k, v in graph.initializers.items() if v.shape == (1, 2, 16)]
    assert len(grid) == 1 and grid[0].dtype == np.float32
    np.testing.assert_array_equal(grid[0][0, 0, :4], np.array([2, 6, 10, 14], np.float32))   # (0.5 + i) * 4
    x = np.random.default_rng(0).normal(size=(2, 3, 16, 16)).astype(np.float32)
    got = float_runner(graph).run(x)[graph.outputs[0]]
    ms.set_context(mode=ms.PYNATIVE_MODE)
    want = net(ms.Tensor(x)).asnumpy()
    assert got.shape == want.shape == (2, 3, 2, 16)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_slice_assignment_and_pow_read_as_scatter_and_pow(tmp_path):
    """YOLOv5's decoding: ``y[..., 0:2] = ...`` is TensorScatterUpdate with constant int64 indices (built
    from constants when read), ``** 2`` is Pow; the IR equals MindSpore."""
    net = nets.SliceAssignDecode()
    graph = read_mindir(nets.export(net, tmp_path / "v5.mindir"))
    ops = graph.op_counts()
    assert ops["TensorScatterUpdate"] == 2 and ops["Pow"] == 1 and ops["Sigmoid"] == 1
    scatter = [n for n in graph.nodes if n.op == "TensorScatterUpdate"]
    assert all(graph.initializers[n.inputs[1]].dtype == np.int64 for n in scatter)
    x = np.random.default_rng(0).normal(size=(2, 3, 16, 16)).astype(np.float32)
    got = float_runner(graph).run(x)[graph.outputs[0]]
    ms.set_context(mode=ms.PYNATIVE_MODE)
    want = net(ms.Tensor(x)).asnumpy()
    assert got.shape == want.shape == (2, 32, 6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_unsupported_op_names_type_and_node(tmp_path):
    path = nets.export(nets.Unsupported(), tmp_path / "u.mindir")
    with pytest.raises(UnsupportedNetworkError, match=r"unsupported op 'Cos' at node .*Default/Cos-op0"):
        read_mindir(path)


def test_unreadable_file(tmp_path):
    bad = tmp_path / "bad.mindir"
    bad.write_bytes(b"\x00not a protobuf" * 10)
    with pytest.raises(UnsupportedNetworkError, match="bad.mindir"):
        read_mindir(bad)
    with pytest.raises(UnsupportedNetworkError, match="not found"):
        read_mindir(tmp_path / "missing.mindir")


def test_verify_catches_an_ir_that_differs_from_mindspore(exported):
    _, path = exported["ResNetStyle"]
    graph = read_mindir(path)
    x = np.random.default_rng(1).normal(size=(2, 3, 16, 16)).astype(np.float32)
    reference = mindspore_outputs(path, x, batch=2)
    assert verify_graph(graph, x, reference, path, 1e-3)["relative_diff"] < 1e-5
    w = next(n for n in graph.nodes if n.op == "Conv2D").inputs[1]
    graph.initializers[w] = graph.initializers[w] * 1.1
    with pytest.raises(UnsupportedNetworkError, match="does not compute what MindSpore computes"):
        verify_graph(graph, x, reference, path, 1e-3)
