"""The Ascend deploy graph (deploy.onnx): format, AMCT record, and the device arithmetic it carries."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from support import deploy_interpreter, nets

from quantflow.backends.aipp import parse
from quantflow.backends.deploy_mindspore import export_deploy_mindir
from quantflow.backends.deploy_onnx import check_deploy, deploy_model, record_text
from quantflow.data.images import load_images, scan_class_folders
from quantflow.engine.aipp import aipp_batch
from quantflow.engine.int8_emulator import Emulator
from quantflow.engine.lowering import lower
from quantflow.frontends.mindir import read_mindir
from quantflow.quantization.calibrater import calibrate
from quantflow.quantization.deploy import quantized_graph
from quantflow.quantization.passes import fold_for_quantization
from quantflow.quantization.qparams import QuantParams
from quantflow.quantization.scheme import deq_scale_uint64


def test_deq_scale_packing_round_trips():
    deq = np.array([1e-5, 0.0123, 3.5, 2.0 ** -30], np.float32)
    packed = deq_scale_uint64(deq)
    assert packed.dtype == np.uint64 and np.all(packed >> np.uint64(32) == 0)
    np.testing.assert_array_equal(deploy_interpreter.unpack_deq_scale(packed), deq)
    assert int(packed[2]) == 0x40600000  # float32 bits of 3.5


def quantized(name: str, tmp_path):
    graph = fold_for_quantization(read_mindir(nets.export(getattr(nets, name)(), tmp_path / f"{name}.mindir")))
    rng = np.random.default_rng(7)
    qp = calibrate(graph, [rng.normal(size=(16, 3, 16, 16)).astype(np.float32)], "minmax",
                   rollback_small_channels=False)
    return graph, qp


def test_deploy_graph_format(tmp_path):
    graph, qp = quantized("ResNetStyle", tmp_path)
    model = deploy_model(quantized_graph(graph, qp), "x")
    check_deploy(model)
    assert model.opset_import[0].domain == "" and model.opset_import[0].version <= 13
    assert model.graph.input[0].name == "x"
    nodes = model.graph.node
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    quants = [n for n in nodes if n.op_type == "AscendQuant"]
    deqs = [n for n in nodes if n.op_type == "AscendDequant"]
    assert len(quants) == len(deqs) == len(qp.ops) == 7  # six convolutions and the dense layer
    for q, quant, deq in zip(qp.ops, quants, deqs):
        a = {x.name: onnx.helper.get_attribute_value(x) for x in quant.attribute}
        assert a["scale"] == pytest.approx(1 / q.scale_d, rel=1e-6) and a["offset"] == q.offset_d
        assert a["sqrt_mode"] == 0 and a["round_mode"] == b"Round" and "dst_type" not in a
        cube = next(n for n in nodes if quant.output[0] in n.input)
        assert cube.op_type in ("Conv", "Gemm") and cube.name == q.scope
        assert inits[cube.input[1]].dtype == np.int8 and inits[cube.input[2]].dtype == np.int32
        assert deq.input[0] == cube.output[0] and inits[deq.input[1]].dtype == np.uint64
        d = {x.name: onnx.helper.get_attribute_value(x) for x in deq.attribute}
        assert d["relu_flag"] == int(q.relu) and d["sqrt_mode"] == 0 and d["dtype"] == 0
    assert sum(q.relu for q in qp.ops) >= 3  # stem and the blocks' first convolutions fuse their ReLU


@pytest.mark.parametrize("name", ["ResidualNet", "ResNetStyle", "MobileNetV3Style", "DenseNetStyle",
                                  "ShuffleNetStyle", "OpZoo"])
def test_deploy_graph_computes_what_the_emulator_computes(tmp_path, name):
    graph, qp = quantized(name, tmp_path)
    model = deploy_model(quantized_graph(graph, qp), "x")
    x16 = np.random.default_rng(8).normal(size=(2, 3, 16, 16)).astype(np.float16)
    np.testing.assert_array_equal(deploy_interpreter.run(model, x16)[0], Emulator(quantized_graph(graph, qp)).logits(x16))


@pytest.mark.parametrize("name", ["MobileNetV3Style", "OpZoo"])
def test_float16_ops_compute_what_the_interpreter_computes_with_nothing_quantized(tmp_path, name):
    """Every float op on its own float16 values, with no INT8 layer to round the differences away: the
    emulation's lowerings (their own constants as float16 numbers too: GeLU's 0.044715) equal the
    interpreter's one-node-at-a-time float16 arithmetic bit for bit."""
    graph, qp = quantized(name, tmp_path)
    none = QuantParams(qp.method, [])
    x16 = np.random.default_rng(10).normal(size=(2, 3, 16, 16)).astype(np.float16)
    np.testing.assert_array_equal(deploy_interpreter.run(deploy_model(quantized_graph(graph, none), "x"), x16)[0],
                                  Emulator(quantized_graph(graph, none)).logits(x16))


@pytest.mark.parametrize("name", ["ResidualNet", "MobileNetV3Style", "DenseNetStyle", "ShuffleNetStyle", "OpZoo"])
def test_deploy_mindir_read_back_computes_the_same(tmp_path, name):
    graph, qp = quantized(name, tmp_path)
    deploy = quantized_graph(graph, qp)
    status = export_deploy_mindir(deploy, tmp_path)
    assert status["deploy_mindir"] == "deploy.mindir" and (tmp_path / "deploy_net.py").is_file()
    back = read_mindir(tmp_path / "deploy.mindir")
    ops = back.op_counts()
    assert ops["Quant"] == ops["Dequant"] == len(qp.ops)
    assert all(back.initializers[n.inputs[1]].dtype == np.int8 for n in back.nodes if n.op == "Conv2D"
               and "offset_x" in n.attrs) and ops["Conv2D"] >= len(qp.ops)
    x16 = np.random.default_rng(9).normal(size=(2, 3, 16, 16)).astype(np.float16)
    np.testing.assert_array_equal(Emulator(back).logits(x16), Emulator(deploy).logits(x16))


def test_record_file_is_amct_onnx_form_keyed_by_graph_onnx_node_names(tmp_path):
    """AMCT's ONNX/MindSpore record: scale_d, offset_d, scale_w[] and offset_w[] per INT8 layer, keyed by the
    layer's node name in graph.onnx (the float model quantflow writes); no Caffe-only channels/height/width."""
    graph, qp = quantized("DenseNetStyle", tmp_path)
    text = record_text(qp)
    keys = re.findall(r'key: "([^"]+)"', text)
    assert keys == [q.scope for q in qp.ops]
    graph_onnx_names = {n.name for n in lower(graph, "float32", input_name="x").graph.node}
    assert set(keys) <= graph_onnx_names
    first = text.split("record {")[1]
    assert f"scale_d: {qp.ops[0].scale_d:.9g}" in first and f"offset_d: {qp.ops[0].offset_d}" in first
    assert first.count("scale_w:") == first.count("offset_w: 0") == len(qp.ops[0].scale_w)
    fields = set(re.findall(r"^\s+(\w+):", text, re.M)) - {"key"}
    assert fields == {"scale_d", "offset_d", "scale_w", "offset_w"}


def check_built_deploy(latest: dict, eval_dir: Path, every: int = 36) -> int:
    """A `doit` build's deploy.onnx and deploy.mindir (``latest``: its latest.json), run from uint8 eval
    images through its AIPP config, equal the emulation the gate used, bit for bit; returns the number
    of images compared."""
    dirs = {k: Path(v) for k, v in latest["artifacts"].items()}
    kdir = dirs["export"]
    model = onnx.load(str(kdir / "deploy.onnx"))
    check_deploy(model)
    graph = fold_for_quantization(read_mindir(dirs["graph"] / "model.mindir"))
    qp = QuantParams.load(dirs["fallback"])
    items = scan_class_folders(eval_dir, 10)[::every]
    images = load_images([i.path for i in items], 3, 32, 32)
    x16 = aipp_batch(parse((dirs["aipp"] / "aipp.cfg").read_text()), images, "BGR").astype(np.float16)
    emulated = Emulator(quantized_graph(graph, qp)).logits(x16)
    got = np.concatenate([deploy_interpreter.run(model, x16[i:i + 1])[0] for i in range(len(x16))])
    np.testing.assert_array_equal(got, emulated)
    # the network's convolution + BiasAdd as one op, as GE fuses them (the rolled-back float16 convolutions)
    back = fold_for_quantization(read_mindir(kdir / "deploy.mindir"))
    np.testing.assert_array_equal(Emulator(back).logits(x16), emulated)
    assert len(re.findall(r"^record \{", (kdir / "record.txt").read_text(), re.M)) == len(qp.ops)
    return len(x16)


def test_demo_deploy_graph_matches_the_gated_emulation(built_demo, demo_cfg):
    """DigitsNet's deploy graphs from `doit` compute what the gate emulated."""
    latest = json.loads((built_demo[0] / "build" / "latest.json").read_text())
    assert check_built_deploy(latest, demo_cfg.path(demo_cfg.evaluation.data_dir)) == 10
