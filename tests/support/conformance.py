"""The rules CANN's own compile passes and ONNX parser impose on a deploy graph, checked on what quantflow wrote
(docs/how-it-works.md "What runs on the device"; the sources are cited in quantflow/quantization/device_rules.py,
quantflow/ops/quant.py, quantflow/ops/nn.py and quantflow/backends/).  Each check raises AssertionError naming
the node and the rule it breaks."""
from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantflow.quantization.device_rules import MIN_BIAS_OPTIMIZE_CHANNEL

CUBES = ("Conv", "Gemm")


def _attrs(node) -> dict:
    return {a.name: (a.type, helper.get_attribute_value(a)) for a in node.attribute}


def check_deploy_onnx(model: onnx.ModelProto) -> int:
    """deploy.onnx: AscendQuant -> (Pad) -> Conv/Gemm -> AscendDequant adjacent, attribute types as CANN's ONNX
    plugins read them, no INT8 convolution on 16 channels or fewer, quantized Gemm as [K, N] with transB = 0,
    kernel_shape on every Conv.  Returns the number of INT8 layers."""
    g = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    readers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    A = onnx.AttributeProto
    int8_layers = 0
    for n in g.node:
        a = _attrs(n)
        if n.op_type == "Conv":
            assert "kernel_shape" in a, f"Conv {n.name}: no kernel_shape (CANN's Conv plugin needs it)"
        if n.op_type != "AscendQuant":
            continue
        assert a["scale"][0] == A.FLOAT and a["offset"][0] == A.FLOAT, f"{n.name}: scale/offset must be floats"
        assert float(a["offset"][1]).is_integer() and -128 <= a["offset"][1] <= 127, f"{n.name}: offset not int8"
        assert a["round_mode"] == (A.STRING, b"Round") and a["sqrt_mode"] == (A.INT, 0), n.name
        assert "dst_type" not in a or a["dst_type"][0] == A.STRING, f"{n.name}: dst_type must be a string if given"
        (cube,) = readers[n.output[0]]
        if cube.op_type == "Pad":
            (cube,) = readers[cube.output[0]]
        assert cube.op_type in CUBES, f"{n.name}: AscendQuant feeds {cube.op_type}, not a cube"
        (deq,) = readers[cube.output[0]]
        assert deq.op_type == "AscendDequant", f"{cube.name}: followed by {deq.op_type}, not AscendDequant"
        d = _attrs(deq)
        assert d["dtype"] == (A.INT, 0) and d["sqrt_mode"] == (A.INT, 0) and d["relu_flag"][0] == A.INT, deq.name
        deq_scale = inits[deq.input[1]]
        assert deq_scale.dtype == np.uint64 and not np.any(deq_scale >> np.uint64(32)), f"{deq.name}: deq_scale"
        w, b = inits[cube.input[1]], inits[cube.input[2]]
        assert w.dtype == np.int8 and b.dtype == np.int32, f"{cube.name}: weight int8 and bias int32"
        c = _attrs(cube)
        if cube.op_type == "Conv":   # the channels AscendQuant reads: the weight's per-group input channels x groups
            channels = w.shape[1] * c.get("group", (A.INT, 1))[1]
        else:                        # MatMulV2's quant pass takes N from the weight's dim[1]: [K, N], transB = 0
            assert c.get("transB", (A.INT, 0))[1] == 0 and c.get("transA", (A.INT, 0))[1] == 0, cube.name
            assert w.shape[1] == len(deq_scale) == len(b), f"{cube.name}: weight {w.shape} is not [K, N]"
            channels = w.shape[0]
        assert channels > MIN_BIAS_OPTIMIZE_CHANNEL, (
            f"{cube.name}: INT8 on {channels} input channels, which CANN rolls back to float16")
        int8_layers += 1
    return int8_layers


def check_deploy_mindir(graph, source: str) -> int:
    """The deploy MindSpore network (read back with quantflow's MindIR front-end; ``source``: its deploy_net.py):
    Quant -> Conv2D (-> its BiasAdd, MindSpore's form of a convolution's bias) -> Dequant adjacent, nothing else
    between (a Dense's reshapes on the float side), no offset on the Conv2D (MindSpore's GE adapter drops it),
    no INT8 convolution on 16 channels or fewer.  Returns the number of INT8 layers."""
    assert "offset_a" not in source, "deploy_net.py sets offset_a, which MindSpore's GE adapter drops"
    readers = graph.consumers()
    count = 0
    for q in (n for n in graph.nodes if n.op == "Quant"):
        assert graph.tensors[q.inputs[0]].dtype.startswith("float"), f"{q.scope}: Quant reads a non-float tensor"
        assert graph.shape(q.inputs[0])[1] > MIN_BIAS_OPTIMIZE_CHANNEL, f"{q.scope}: INT8 on <= 16 channels"
        # MindSpore's export merges equal Quants of one tensor (a ResNet's downsampling and block convolutions):
        # CANN's pass handles each of its cubes, removing the Quant with its last one
        for cube in readers[q.outputs[0]]:
            assert cube.op == "Conv2D", f"{q.scope}: Quant feeds {cube.op}, not a Conv2D"
            nxt = readers[cube.outputs[0]]
            if [n.op for n in nxt] == ["BiasAdd"]:
                nxt = readers[nxt[0].outputs[0]]
            assert [n.op for n in nxt] == ["Dequant"], f"{cube.scope}: followed by {[n.op for n in nxt]}"
            count += 1
    return count


def check_record(text: str, graph_onnx: onnx.ModelProto, int8_scopes: list[str]) -> None:
    """record.txt: AMCT's ONNX/MindSpore record fields only, one record per INT8 layer, keyed by its graph.onnx
    node name."""
    keys = re.findall(r'key: "([^"]+)"', text)
    assert keys == list(int8_scopes), "record keys are not the INT8 layers in graph order"
    assert set(keys) <= {n.name for n in graph_onnx.graph.node}, "a record key is not a graph.onnx node name"
    assert set(re.findall(r"^\s+(\w+):", text, re.M)) - {"key"} <= {"scale_d", "offset_d", "scale_w", "offset_w"}


def check_qparams(meta: dict, quantizable: int) -> None:
    """qparams.json: every quantizable op with its device precision and the reason."""
    assert len(meta["ops"]) == quantizable, "qparams.json does not list every quantizable op"
    for e in meta["ops"]:
        assert e["device_precision"] in ("int8", "float16") and e["reason"], e["node"]
