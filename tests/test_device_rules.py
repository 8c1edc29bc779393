"""Which quantizable ops are INT8 on the device: CANN rolls convolutions reading 16 channels or fewer back to
float16 (and so quantflow leaves them float16 everywhere, a Dense reading 16 features or fewer too); every
quantizable op is listed in qparams.json with its device precision and the reason; the emulation, deploy.onnx and
the deploy MindIR compute such a layer as a float16 op, bit for bit alike."""
from __future__ import annotations

import json

import numpy as np
import pytest
from support import deploy_interpreter, nets

from quantflow.backends.deploy_mindspore import export_deploy_mindir
from quantflow.backends.deploy_onnx import deploy_model
from quantflow.engine.int8_emulator import Emulator
from quantflow.frontends.mindir import read_mindir
from quantflow.quantization.calibrater import calibrate, in_channels, precision_plan, quantizable_nodes
from quantflow.quantization.deploy import quantized_graph
from quantflow.quantization.device_rules import MIN_BIAS_OPTIMIZE_CHANNEL, rollback_reason
from quantflow.quantization.passes import fold_for_quantization
from quantflow.quantization.qparams import QuantParams
from quantflow.quantization.scheme import quantize_bias, quantize_weight


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    folded = fold_for_quantization(read_mindir(nets.export(nets.WideNet(), tmp_path_factory.mktemp("w") / "w.mindir")))
    x = np.random.default_rng(3).normal(size=(16, 3, 16, 16)).astype(np.float32)
    return folded, calibrate(folded, [x], "minmax")


def test_the_rule_is_cannes_channel_limit():
    assert MIN_BIAS_OPTIMIZE_CHANNEL == 16
    assert rollback_reason("Conv2D", 17) is None and rollback_reason("MatMul", 17) is None
    assert "16" in rollback_reason("Conv2D", 16) and "float16" in rollback_reason("Conv2D", 3)
    assert "1x1 Conv2D" in rollback_reason("MatMul", 12)


def test_convolutions_reading_16_channels_or_fewer_stay_float16(wide):
    folded, qp = wide
    channels = {n.label: in_channels(folded, n) for n in quantizable_nodes(folded)}
    assert sorted(channels.values()) == [3, 12, 16, 24, 32, 32, 32]
    assert {q.scope for q in qp.ops} == {s for s, c in channels.items() if c > 16}
    assert {f.scope for f in qp.float16} == {s for s, c in channels.items() if c <= 16}
    assert all("float16" in f.reason for f in qp.float16)
    assert {q.op for q in qp.ops} == {"Conv2D", "MatMul"}   # the depthwise and 1x1 convolutions, the first Dense


def test_a_skipped_layer_and_the_rolled_back_ones_are_listed_with_their_reason(wide, tmp_path):
    folded, _ = wide
    int8, float16 = precision_plan(folded, skip=("MatMul",))
    assert {f.op for f in float16} == {"Conv2D", "MatMul"} and all(n.op == "Conv2D" for n in int8)
    assert [f.reason for f in float16 if f.op == "MatMul"] == ["quantization.skip pattern 'MatMul'"] * 2
    x = np.random.default_rng(4).normal(size=(8, 3, 16, 16)).astype(np.float32)
    qp = calibrate(folded, [x], "minmax", skip=("MatMul",))
    qp.save(tmp_path)
    entries = json.loads((tmp_path / "qparams.json").read_text())["ops"]
    assert [e["node"] for e in entries] == [n.name for n in quantizable_nodes(folded)]   # every one, in graph order
    assert {e["device_precision"] for e in entries} == {"int8", "float16"} and all(e["reason"] for e in entries)
    back = QuantParams.load(tmp_path)
    assert [q.node for q in back.ops] == [q.node for q in qp.ops] and back.float16 == qp.float16
    moved = back.without([back.ops[0].node], "rolled back by the automatic fallback")
    assert len(moved.ops) == len(back.ops) - 1 and moved.float16[-1].reason == "rolled back by the automatic fallback"


def test_rolled_back_layers_are_float16_ops_in_the_emulation_and_both_deploy_graphs(wide, tmp_path):
    folded, qp = wide
    deploy = quantized_graph(folded, qp)
    assert deploy.op_counts()["Quant"] == len(qp.ops) == 4
    x16 = np.random.default_rng(5).normal(size=(2, 3, 16, 16)).astype(np.float16)
    emulated = Emulator(deploy).logits(x16)
    model = deploy_model(deploy, "x")
    np.testing.assert_array_equal(deploy_interpreter.run(model, x16)[0], emulated)
    float_convs = [n for n in model.graph.node if n.op_type == "Conv" and n.input[0] not in
                   {q.output[0] for q in model.graph.node if q.op_type == "AscendQuant"}]
    assert {n.name for n in float_convs} == {f.scope for f in qp.float16 if f.op == "Conv2D"}
    export_deploy_mindir(deploy, tmp_path)
    # a convolution's BiasAdd joins the convolution, as GE fuses it (AABiasaddConvFusion): one float16 rounding
    back = fold_for_quantization(read_mindir(tmp_path / "deploy.mindir"))
    assert back.op_counts()["Quant"] == 4
    np.testing.assert_array_equal(Emulator(back).logits(x16), emulated)


def test_a_dead_channel_gets_the_scale_its_bias_needs():
    """Trained PaddlePaddle models have output channels with max|w| ~ 1e-34: scale_w = max|w| / 127 put their bias
    far beyond int32.  Their scale is raised to what the bias needs; the weights quantize to 0, as they are."""
    w = np.random.default_rng(0).normal(size=(3, 8, 1, 1))
    w[1] = 1e-34
    b = np.array([0.1, -0.05, 0.2])
    scale_d = 0.02
    w_q, scale_w = quantize_weight(w, 0, b, scale_d)
    bias = quantize_bias(b, scale_d, scale_w, "layer")
    assert np.all(w_q[1] == 0) and abs(int(bias[1])) <= 2 ** 30
    ok, _ = quantize_weight(w, 0)
    np.testing.assert_array_equal(w_q[[0, 2]], ok[[0, 2]])   # the live channels as before


def test_the_mindspore_deploy_network_keeps_quant_cube_dequant_adjacent(wide, tmp_path):
    """A Dense is a 1x1 Conv2D with its reshapes on the float side; no offset on the Conv2D (the device takes the
    adjacent AscendQuant's); reading the network back, every int8 Conv2D's offset_x is its Quant's offset."""
    folded, qp = wide
    deploy = quantized_graph(folded, qp)
    export_deploy_mindir(deploy, tmp_path)
    source = (tmp_path / "deploy_net.py").read_text()
    assert "offset_a" not in source
    back = read_mindir(tmp_path / "deploy.mindir")
    producer = back.producer()
    consumers = back.consumers()
    for quant in (n for n in back.nodes if n.op == "Quant"):
        (cube,) = consumers[quant.outputs[0]]
        assert cube.op == "Conv2D" and cube.attrs["offset_x"] == int(quant.attrs["offset"])
        after = consumers[cube.outputs[0]]
        assert [n.op for n in after] in (["Dequant"], ["BiasAdd"])
        if after[0].op == "BiasAdd":
            assert [n.op for n in consumers[after[0].outputs[0]]] == ["Dequant"]
        assert producer.get(quant.inputs[0]) is None or back.tensors[quant.inputs[0]].dtype.startswith("float")
