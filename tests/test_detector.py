"""A YOLO-style detector (tests/nets.py DetectorStyle: SiLU backbone, nearest upsampling, concatenation,
two Sigmoid heads) through the graph stages, every output checked: the IR against MindSpore, the INT8
emulation against FP32, the deploy ONNX graph and the deploy MindIR read back against the emulation."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

import deploy_interpreter
import nets
from quantflow.backends.deploy_mindspore import export_deploy_mindir
from quantflow.backends.deploy_onnx import check_deploy, deploy_model
from quantflow.engine.float_runner import float_runner
from quantflow.engine.int8_emulator import Emulator
from quantflow.frontends.mindir import read_mindir
from quantflow.quantization.calibrater import calibrate
from quantflow.quantization.deploy import quantized_graph
from quantflow.quantization.passes import fold_for_quantization

SHAPE = (2, 3, 32, 32)
HEADS = [(2, 27, 4, 4), (2, 27, 8, 8)]  # 3 anchors x (4 box + objectness + 4 classes), strides 8 and 4


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    net = nets.DetectorStyle()
    path = nets.export(net, tmp_path_factory.mktemp("det") / "det.mindir", shape=SHAPE)
    graph = read_mindir(path)
    folded = fold_for_quantization(graph)
    rng = np.random.default_rng(11)
    qp = calibrate(folded, [rng.normal(size=(16,) + SHAPE[1:]).astype(np.float32)], "minmax")
    return net, graph, folded, qp


def test_every_head_is_an_output_and_the_ir_equals_mindspore(detector):
    net, graph, _, _ = detector
    assert {"SiLU", "ResizeNearestNeighborV2", "Concat", "Sigmoid"} <= set(graph.op_counts())
    assert [tuple(graph.shape(o)) for o in graph.outputs] == HEADS
    x = np.random.default_rng(0).normal(size=SHAPE).astype(np.float32)
    got = float_runner(graph).run(x)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    want = [o.asnumpy() for o in net(ms.Tensor(x))]
    for name, w in zip(graph.outputs, want):
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5)


def test_every_head_quantizes_and_emulates_close_to_fp32(detector):
    _, graph, folded, qp = detector
    assert len(qp.ops) == sum(1 for n in folded.nodes if n.op == "Conv2D") == 7
    x = np.random.default_rng(1).normal(size=(8,) + SHAPE[1:]).astype(np.float32)
    fp = float_runner(graph).run(x)
    q = Emulator(folded, qp).outputs(x.astype(np.float16))
    for name in graph.outputs:
        diff = np.abs(fp[name] - q[name])
        # Sigmoid outputs in (0, 1): INT8 moves each by a few hundredths at most, on average by a small
        # part of the outputs' spread across images and positions
        assert 0 < diff.max() < 0.1 and diff.mean() < 0.1 * fp[name].std(), (name, diff.max(), diff.mean())


def test_deploy_graphs_compute_every_head_as_the_emulation_does(detector, tmp_path):
    _, _, folded, qp = detector
    x16 = np.random.default_rng(2).normal(size=SHAPE).astype(np.float16)
    emulated = Emulator(folded, qp).outputs(x16)
    model = deploy_model(folded, qp, "x")
    check_deploy(model)
    assert len(model.graph.output) == len(HEADS)
    for got, name in zip(deploy_interpreter.run(model, x16), folded.outputs):
        np.testing.assert_array_equal(got, emulated[name])
    deploy = quantized_graph(folded, qp)
    export_deploy_mindir(deploy, tmp_path)
    back = read_mindir(tmp_path / "deploy.mindir")
    assert len(back.outputs) == len(HEADS)
    read_back = Emulator(back).outputs(x16)
    for a, b in zip(back.outputs, deploy.outputs):
        np.testing.assert_array_equal(read_back[a], emulated[b])
