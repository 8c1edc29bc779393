"""ONNX -> graph IR: the IR the MindIR front-end produces for the same network, run against onnxruntime
on the original ONNX, folded, calibrated and emulated in INT8; the FP32 ONNX quantflow writes reads back."""
from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantflow.backends.deploy_mindspore import export_deploy_mindir
from quantflow.backends.deploy_onnx import check_deploy, deploy_model
from quantflow.engine.int8_emulator import Emulator
from quantflow.engine.lowering import lower
from quantflow.engine.runner import float_runner
from quantflow.errors import UnsupportedNetworkError
from quantflow.frontends.mindir import read_mindir
from quantflow.frontends.onnx_model import read_onnx
from quantflow.quantization.calibrater import calibrate, quantizable_nodes
from quantflow.quantization.deploy import quantized_graph
from quantflow.quantization.passes import fold_for_quantization

SHAPE = (4, 3, 16, 16)
CLASSES = 10


class Net:
    """A small ONNX graph writer: named nodes, seeded He-initialized weights, BatchNorm statistics."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], [], 0

    def init(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, name: str, shape, fan_in: int) -> str:
        return self.init(name, (self.rng.normal(size=shape) * np.sqrt(2.0 / fan_in)).astype(np.float32))

    def op(self, op_type: str, inputs, name: str | None = None, outputs: int = 1, **attrs):
        self.count += 1
        name = name or f"{op_type.lower()}{self.count}"
        outs = [f"{name}_out{i}" if outputs > 1 else f"{name}_out" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs if outputs > 1 else outs[0]

    def conv(self, x, name, cin, cout, k=3, stride=1, group=1, bias=False, **attrs):
        if "auto_pad" not in attrs:
            attrs.setdefault("pads", [k // 2] * 4)
        w = self.weight(f"{name}.weight", (cout, cin // group, k, k), cin // group * k * k)
        ins = [x, w] + ([self.init(f"{name}.bias", self.rng.normal(0, 0.1, cout).astype(np.float32))] if bias else [])
        return self.op("Conv", ins, name, kernel_shape=[k, k], strides=[stride, stride], group=group, **attrs)

    def bn(self, x, name, c):
        r = self.rng
        stats = [r.uniform(0.5, 1.5, c), r.normal(0, 0.1, c), r.normal(0, 0.1, c), r.uniform(0.5, 1.5, c)]
        ins = [self.init(f"{name}.{k}", v.astype(np.float32)) for k, v in zip(("gamma", "beta", "mean", "var"), stats)]
        return self.op("BatchNormalization", [x, *ins], name, epsilon=1e-5)

    def gemm(self, x, name, cin, cout, trans_b=1, bias_shape=None, **attrs):
        w = self.weight(f"{name}.weight", (cout, cin) if trans_b else (cin, cout), cin)
        b = self.init(f"{name}.bias", self.rng.normal(0, 0.1, bias_shape or (cout,)).astype(np.float32))
        return self.op("Gemm", [x, w, b], name, transB=trans_b, **attrs)

    def const(self, value, dtype=np.int64) -> str:
        return self.op("Constant", [], value=numpy_helper.from_array(np.asarray(value, dtype)))

    def model(self, out, input_shape=SHAPE, opset=17, output_shape=None) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "net", [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(input_shape))],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, output_shape)], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        # a valid model whose shapes ONNX infers (the checker wants the output's shape; the front-end gets none)
        onnx.checker.check_model(onnx.shape_inference.infer_shapes(model, strict_mode=True))
        return model


def head_gap_gemm(n: Net, x, c):
    """GlobalAveragePool + Flatten + Gemm(transB=1): torchvision's classifier head."""
    return n.gemm(n.op("Flatten", [n.op("GlobalAveragePool", [x])], axis=1), "fc", c, CLASSES)


# ----------------------------------------------------------------------------- the five networks

def residual():
    n = Net(1)
    x = n.op("Relu", [n.bn(n.conv("input", "c1", 3, 8), "bn1", 8)])
    y = n.op("Relu", [n.bn(n.conv(x, "c2", 8, 8), "bn2", 8)])
    y = n.bn(n.conv(y, "c3", 8, 8), "bn3", 8)
    z = n.op("Relu", [n.op("Add", [y, x], "add")])
    return n.model(head_gap_gemm(n, z, 8)), 4, {"Conv2D", "BatchNorm", "ReLU", "Add", "AdaptiveAvgPool2D", "Flatten",
                                                "MatMul", "BiasAdd"}


def depthwise():
    n = Net(2)
    six, zero = n.init("six", np.float32(6.0)), n.init("zero", np.float32(0.0))
    x = n.op("Clip", [n.bn(n.conv("input", "stem", 3, 16, stride=2), "bn0", 16), zero, six])
    x = n.op("Clip", [n.bn(n.conv(x, "dw", 16, 16, group=16), "bn1", 16), zero, six])
    x = n.bn(n.conv(x, "pw", 16, 24, k=1), "bn2", 24)
    # ReduceMean + MatMul (weight C x classes) + Add: a Dense written out by hand
    y = n.op("ReduceMean", [x], axes=[2, 3], keepdims=0)
    y = n.op("MatMul", [y, n.weight("fc.weight", (24, CLASSES), 24)])
    y = n.op("Add", [y, n.init("fc.bias", n.rng.normal(0, 0.1, CLASSES).astype(np.float32))])
    return n.model(y), 4, {"Conv2D", "BatchNorm", "ReLU6", "ReduceMean", "MatMul", "BiasAdd"}


def concat():
    n = Net(3)
    x = n.op("Relu", [n.conv("input", "stem", 3, 8, bias=True)])
    a = n.op("Relu", [n.conv(x, "a", 8, 8, k=1, bias=True)])
    b = n.op("Relu", [n.bn(n.conv(x, "b", 8, 8, k=5, dilations=[2, 2], pads=[4, 4, 4, 4]), "bnb", 8)])
    y = n.op("Concat", [a, b], axis=1)
    y = n.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = n.op("Reshape", [n.op("GlobalAveragePool", [y]), n.const([0, -1])])
    return n.model(n.gemm(y, "fc", 16, CLASSES, trans_b=0)), 4, {"Conv2D", "BiasAdd", "Concat", "MaxPool", "Reshape",
                                                                  "MatMul"}


def silu_hswish():
    n = Net(4)
    x = n.bn(n.conv("input", "c1", 3, 16), "bn1", 16)
    x = n.op("Mul", [x, n.op("Sigmoid", [x])], "silu")                 # PyTorch's SiLU export
    x = n.bn(n.conv(x, "c2", 16, 16, auto_pad="SAME_UPPER", stride=2), "bn2", 16)
    x = n.op("HardSwish", [x], "hswish")
    x = n.op("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2])
    return n.model(head_gap_gemm(n, x, 16)), 3, {"SiLU", "HSwish", "AvgPool", "Conv2D", "MatMul"}


def gemm_head():
    n = Net(5)
    x = n.op("Relu", [n.conv("input", "c1", 3, 16, stride=2, bias=True)])
    x = n.op("Flatten", [n.op("GlobalAveragePool", [x])])
    x = n.op("Relu", [n.gemm(x, "fc1", 16, 32, bias_shape=(1, 32))])
    x = n.gemm(x, "fc2", 32, CLASSES)
    return n.model(n.op("Softmax", [x], axis=1)), 3, {"Conv2D", "AdaptiveAvgPool2D", "Flatten", "MatMul", "BiasAdd",
                                                       "Softmax"}


NETWORKS = {f.__name__: f for f in (residual, depthwise, concat, silu_hswish, gemm_head)}


def ort_run(model: onnx.ModelProto, x: np.ndarray, batch: int = SHAPE[0]) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i:i + batch]})[0] for i in range(0, len(x), batch)])


def assert_close(got, want, rtol=1e-5):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(0).normal(size=(32,) + SHAPE[1:]).astype(np.float32)


@pytest.mark.parametrize("name", list(NETWORKS))
def test_network_reads_runs_folds_calibrates_and_emulates(name, tmp_path, images):
    model, n_quantized, ops = NETWORKS[name]()
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    graph = read_onnx(path)
    assert ops <= set(graph.op_counts()), graph.op_counts()
    assert graph.name == name and [graph.tensors[i].shape for i in graph.inputs] == [SHAPE]
    want = ort_run(model, images)
    assert_close(float_runner(graph).run(images)[graph.outputs[0]], want)

    folded = fold_for_quantization(graph)
    assert not {"BatchNorm", "BiasAdd"} & set(folded.op_counts()), folded.op_counts()
    assert_close(float_runner(folded).run(images)[folded.outputs[0]], want)

    qp = calibrate(folded, [images], "minmax", rollback_small_channels=False)
    assert len(qp.ops) == n_quantized and {q.op for q in qp.ops} <= {"Conv2D", "MatMul"}
    assert all(len(folded.node(q.node).inputs) == 3 for q in qp.ops)   # every bias fused (BN folded, BiasAdd)
    q = Emulator(quantized_graph(folded, qp)).logits(images.astype(np.float16))
    assert q.shape == want.shape and np.abs(q - want).max() < 0.1 * np.abs(want).max()
    assert np.mean(q.argmax(1) == want.argmax(1)) >= 0.8


@pytest.mark.parametrize("name", ["concat", "silu_hswish"])
def test_deploy_graphs_of_an_onnx_model(name, tmp_path, images):
    """deploy.onnx and deploy.mindir of an ONNX-read network (padded MaxPool, SiLU, HSwish, AvgPool) are
    written as for a MindSpore one, and the deploy MindIR read back computes what the emulator computes."""
    model, _, _ = NETWORKS[name]()
    folded = fold_for_quantization(read_onnx(model))
    qp = calibrate(folded, [images], "minmax", rollback_small_channels=False)
    check_deploy(deploy_model(quantized_graph(folded, qp), "x"))
    deploy = quantized_graph(folded, qp)
    assert export_deploy_mindir(deploy, tmp_path)["deploy_mindir"] == "deploy.mindir"
    x16 = images[:4].astype(np.float16)
    np.testing.assert_array_equal(Emulator(read_mindir(tmp_path / "deploy.mindir")).logits(x16),
                                  Emulator(deploy).logits(x16))


def test_names_scopes_attributes_and_initializers(tmp_path):
    model, _, _ = residual()
    onnx.save(model, tmp_path / "r.onnx")
    graph = read_onnx(tmp_path / "r.onnx")
    convs = [n for n in graph.nodes if n.op == "Conv2D"]
    assert [n.scope for n in convs] == ["c1", "c2", "c3"]
    assert all(re.fullmatch(r"v\d+", n.name) for n in convs) and convs[0].name == "v0"
    assert [n.inputs[1] for n in convs] == ["c1.weight", "c2.weight", "c3.weight"]   # initializer names kept
    assert convs[0].attrs == {"pads": [1, 1, 1, 1], "strides": [1, 1], "dilations": [1, 1], "group": 1}
    bn = next(n for n in graph.nodes if n.op == "BatchNorm")
    assert bn.inputs[1:] == ["bn1.gamma", "bn1.beta", "bn1.mean", "bn1.var"] and len(bn.outputs) == 5
    assert bn.attrs["epsilon"] == pytest.approx(1e-5) and graph.tensors[bn.outputs[1]].shape == (8,)
    mm = next(n for n in graph.nodes if n.op == "MatMul")
    assert mm.attrs == {"transpose_a": False, "transpose_b": True, "rank_a": 2, "rank_b": 2}   # as nn.Dense exports
    bias = graph.consumers()[mm.outputs[0]][0]
    assert bias.op == "BiasAdd" and bias.attrs == {"axis": 1, "rank": 2} and bias.inputs[1] == "fc.bias"
    assert all(o in graph.tensors and all(d > 0 for d in graph.tensors[o].shape) for n in graph.nodes
               for o in n.outputs)
    again = read_onnx(tmp_path / "r.onnx")
    assert [(n.name, n.op, n.inputs, n.outputs, n.attrs, n.scope) for n in again.nodes] == \
        [(n.name, n.op, n.inputs, n.outputs, n.attrs, n.scope) for n in graph.nodes]


def test_pads_in_ir_order_and_auto_pad(tmp_path):
    n = Net(6)
    a = n.conv("input", "explicit", 3, 4, k=3, pads=[0, 1, 2, 1])          # ONNX [h_begin, w_begin, h_end, w_end]
    b = n.conv(a, "same", 4, 4, k=3, stride=2, auto_pad="SAME_UPPER")       # 16x16 -> 8x8
    c = n.conv(b, "lower", 4, 4, k=2, auto_pad="SAME_LOWER")
    d = n.conv(c, "valid", 4, 4, k=3, auto_pad="VALID")
    model = n.model(d)
    graph = read_onnx(model)
    pads = {x.scope: x.attrs["pads"] for x in graph.nodes}
    assert pads == {"explicit": [0, 1, 2, 1], "same": [0, 0, 1, 1], "lower": [1, 1, 0, 0], "valid": [0, 0, 0, 0]}
    x = np.random.default_rng(1).normal(size=SHAPE).astype(np.float32)
    assert_close(float_runner(graph).run(x)[graph.outputs[0]], ort_run(model, x))


def test_more_ops_match_onnxruntime():
    """The ops beyond the five networks, and the shape arithmetic an exporter writes around them."""
    n = Net(7)
    x = n.conv("input", "c1", 3, 8, bias=True)
    x = n.op("Identity", [n.op("Dropout", [x])])
    x = n.op("Cast", [x], to=TensorProto.FLOAT)
    x = n.op("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5)
    x = n.op("Sub", [x, n.op("Div", [x, n.init("two", np.float32(2.0))])])
    x = n.op("Clip", [x, n.init("lo", np.float32(0.0))])                      # no max: ReLU
    x = n.op("Pad", [x, n.const([0, 0, 1, 0, 0, 0, 0, 2]), n.init("pv", np.float32(0.5))], mode="constant")
    x = n.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)          # 17x18 -> 8x9
    x = n.op("AveragePool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=1)
    x = n.op("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1])   # 4 x 5
    x = n.op("Resize", [x, "", n.init("scales", np.array([1, 1, 2, 2], np.float32))], mode="nearest",
             coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    x = n.op("Resize", [x, "", "", n.const([4, 8, 12, 14])], mode="linear",
             coordinate_transformation_mode="pytorch_half_pixel")
    x = n.op("Slice", [x, n.const([1, 2]), n.const([-1, 100]), n.const([3, 2]), n.const([2, 1])])  # 8 x 10 x 6
    x = n.op("Transpose", [x], perm=[0, 2, 3, 1])
    x = n.op("ReduceMean", [x, n.const([1])], keepdims=1)                     # 4 x 1 x 6 x 8 (from 4 x 10 x 6 x 8)
    x = n.op("Squeeze", [x, n.const([1])])                                    # 4 x 6 x 8
    x = n.op("LayerNormalization", [x, n.init("ln.gamma", n.rng.uniform(0.5, 1.5, 8).astype(np.float32)),
                                    n.init("ln.beta", n.rng.normal(0, 0.1, 8).astype(np.float32))], axis=-1)
    top, bottom = n.op("Split", [x], outputs=2, axis=1, num_outputs=2)
    x = n.op("Concat", [bottom, top], axis=1)
    # x.view(x.size(0), -1) as torch.onnx writes it
    batch = n.op("Unsqueeze", [n.op("Gather", [n.op("Shape", [x]), n.const(0)], axis=0), n.const([0])])
    x = n.op("Reshape", [x, n.op("Concat", [batch, n.const([-1])], axis=0)])
    x = n.op("Unsqueeze", [x, n.const([1])])
    x = n.op("Flatten", [x], axis=-1)
    w = n.op("Transpose", [n.op("Cast", [n.init("w16", n.rng.normal(size=(CLASSES, 48)).astype(np.float16))],
                                 to=TensorProto.FLOAT)], perm=[1, 0])          # a weight stored transposed, in float16
    x = n.op("Gemm", [x, w, n.init("b", np.float32(0.25))], alpha=0.5, beta=2.0)
    x = n.op("Softmax", [n.op("Concat", [x, n.op("Mul", [x, x])], axis=-1)], axis=-1)
    model = n.model(x, opset=18)
    graph = read_onnx(model)
    ops = set(graph.op_counts())
    assert {"HSigmoid", "Sub", "Div", "ReLU", "Pad", "MaxPool", "AvgPool", "ResizeNearestNeighbor", "ResizeBilinear",
            "StridedSlice", "Transpose", "ReduceMean", "Squeeze", "LayerNorm", "Split", "Reshape", "ExpandDims",
            "Flatten", "MatMul", "BiasAdd", "Concat", "Softmax"} <= ops, ops
    assert not ops & {"Identity", "Dropout", "Cast", "Shape", "Gather", "Constant"}
    fc = next(n for n in graph.nodes if n.op == "MatMul")
    assert graph.initializers[fc.inputs[1]].dtype == np.float32 and graph.initializers[fc.inputs[1]].shape == (48, 10)
    assert len(quantizable_nodes(fold_for_quantization(graph))) == 2
    x = np.random.default_rng(2).normal(size=(8,) + SHAPE[1:]).astype(np.float32)
    assert_close(float_runner(graph).run(x)[graph.outputs[0]], ort_run(model, x))


@pytest.mark.parametrize("name", ["ResNetStyle", "MobileNetV3Style", "DenseNetStyle", "ShuffleNetStyle"])
def test_the_fp32_onnx_quantflow_writes_reads_back(name, tmp_path):
    from support import nets

    from quantflow.frontends.mindir import read_mindir
    mindir = read_mindir(nets.export(getattr(nets, name)(), tmp_path / f"{name}.mindir"))
    path = tmp_path / "graph.onnx"
    onnx.save(lower(mindir, "float32", input_name="x"), path)
    graph = read_onnx(path)
    x = np.random.default_rng(3).normal(size=(6, 3, 16, 16)).astype(np.float32)
    want = float_runner(mindir).run(x)[mindir.outputs[0]]
    assert_close(float_runner(graph).run(x)[graph.outputs[0]], want)
    folded, mindir_folded = fold_for_quantization(graph), fold_for_quantization(mindir)
    assert_close(float_runner(folded).run(x)[folded.outputs[0]], want)
    assert [n.op for n in quantizable_nodes(folded)] == [n.op for n in quantizable_nodes(mindir_folded)]
    for ours, theirs in zip(quantizable_nodes(folded), quantizable_nodes(mindir_folded)):
        assert ours.attrs.get("pads") == theirs.attrs.get("pads") and len(ours.inputs) == len(theirs.inputs)
    # the same ops, but for those quantflow writes as another ONNX op (AdaptiveAvgPool2D as AveragePool, ...)
    written_as = {"AdaptiveAvgPool2D": "AvgPool", "Flatten": "Reshape", "Squeeze": "Reshape", "ExpandDims": "Reshape"}
    counts = {}
    for n in mindir.nodes:
        counts[written_as.get(n.op, n.op)] = counts.get(written_as.get(n.op, n.op), 0) + 1
    assert graph.op_counts() == dict(sorted(counts.items()))


def test_unknown_op_is_refused_naming_type_and_node():
    n = Net(8)
    model = n.model(n.op("Cos", [n.conv("input", "c1", 3, 4)], "my_cos"))
    with pytest.raises(UnsupportedNetworkError, match=r"unsupported ONNX op 'Cos' \(domain ai.onnx, the default\) at node my_cos\b"):
        read_onnx(model)
    n = Net(8)
    x = n.conv("input", "c1", 3, 4)
    model = n.model(n.op("Clip", [x, n.op("ReduceMin", [x], keepdims=0)], "clip"))   # a bound computed at run time
    with pytest.raises(UnsupportedNetworkError, match=r"node clip .*input 1 \(min\) is computed at run time"):
        read_onnx(model)


def test_dynamic_batch_is_refused_naming_the_input(tmp_path):
    n = Net(9)
    model = n.model(n.op("Relu", [n.conv("input", "c1", 3, 4)]), input_shape=["batch", 3, 16, 16],
                    output_shape=["batch", 4, 16, 16])
    onnx.save(model, tmp_path / "dyn.onnx")
    with pytest.raises(UnsupportedNetworkError, match=r"input 'input' has a dynamic shape \[batch, 3, 16, 16\]"
                                                      r".*dimension 0 is 'batch'.*fixed batch size"):
        read_onnx(tmp_path / "dyn.onnx")
    graph = read_onnx(tmp_path / "dyn.onnx", input_shape=SHAPE)   # or fixed when read
    assert graph.tensors[graph.inputs[0]].shape == SHAPE and graph.tensors[graph.outputs[0]].shape == (4, 4, 16, 16)


def test_unreadable_file(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(UnsupportedNetworkError, match="not a readable ONNX file"):
        read_onnx(bad)
    with pytest.raises(UnsupportedNetworkError, match="not found"):
        read_onnx(tmp_path / "missing.onnx")
