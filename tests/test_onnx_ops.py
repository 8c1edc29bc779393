"""The ONNX ops and features real trained models need (issue 21), each in a small graph built with onnx.helper:
the IR against onnxruntime on the file as given, the float16 emulation against the deploy interpreter (deploy.onnx
node by node) bit for bit, with and without INT8 layers, and the deploy MindIR read back computing the same."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from support import deploy_interpreter
from test_onnx_frontend import Net

from quantflow.backends.deploy_mindspore import export_deploy_mindir
from quantflow.backends.deploy_onnx import check_deploy, deploy_model
from quantflow.engine.int8_emulator import Emulator
from quantflow.engine.runner import float_runner
from quantflow.errors import UnsupportedNetworkError
from quantflow.frontends.mindir import read_mindir
from quantflow.frontends.onnx_model import read_onnx
from quantflow.frontends.source import onnxruntime_outputs
from quantflow.quantization.calibrater import calibrate
from quantflow.quantization.deploy import quantized_graph
from quantflow.quantization.passes import fold_for_quantization


def model_of(n: Net, outputs: list[str], input_shape, opset=17, output_shapes=None) -> onnx.ModelProto:
    """A model with several outputs whose shapes the file does not declare (the front-end must find them)."""
    graph = helper.make_graph(
        n.nodes, "net", [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(input_shape))],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, (output_shapes or {}).get(o)) for o in outputs], n.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(onnx.shape_inference.infer_shapes(model))   # valid (the checker wants output shapes)
    return model


def ort_outputs(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})


# ----------------------------------------------------------------------------- the graphs

def paddle_style():
    """PaddlePaddle / DBNet / YOLO ops: HardSigmoid with Paddle's slope 0.2, Clip to any bounds, LeakyRelu, PRelu,
    ConvTranspose (k2 s2 with a bias; k3 s2 pad 1 output_padding 1), a Split into unequal parts (YOLOv8's DFL
    split), SpaceToDepth (YOLOX's Focus), DepthToSpace in both modes."""
    n = Net(21)
    x = n.conv("input", "c1", 3, 8)
    x = n.op("Mul", [x, n.op("HardSigmoid", [x], alpha=0.2, beta=0.5)], "hsig_paddle")
    x = n.op("Clip", [x, n.init("lo", np.float32(-1.5)), n.init("hi", np.float32(2.0))], "clip")
    x = n.op("LeakyRelu", [n.conv(x, "c2", 8, 8)], "leaky", alpha=0.1)
    x = n.op("PRelu", [x, n.init("slope", n.rng.uniform(0, 0.5, (8, 1, 1)).astype(np.float32))], "prelu")
    up = n.op("ConvTranspose", [x, n.weight("up.weight", (8, 4, 2, 2), 8), n.init("up.bias", np.float32([.1, .2, .3, .4]))],
              "up", kernel_shape=[2, 2], strides=[2, 2])                                     # 16x16 -> 32x32
    up2 = n.op("ConvTranspose", [x, n.weight("up2.weight", (8, 2, 3, 3), 8)], "up2", strides=[2, 2],
               pads=[1, 1, 1, 1], output_padding=[1, 1], group=2)                           # 16x16 -> 32x32, 4 ch
    y = n.op("Concat", [up, up2], axis=1)                                                 # 8 x 32 x 32
    box, cls = n.op("Split", [y, n.const([3, 5])], "split_unequal", outputs=2, axis=1)
    y = n.op("Concat", [n.op("Sigmoid", [cls]), box], axis=1)
    y = n.op("SpaceToDepth", [y], "focus", blocksize=2)                                    # 32 x 16 x 16
    y = n.conv(y, "c3", 32, 16, k=1)
    dcr = n.op("DepthToSpace", [y], "d2s_dcr", blocksize=2, mode="DCR")                   # 4 x 32 x 32
    crd = n.op("DepthToSpace", [y], "d2s_crd", blocksize=2, mode="CRD")
    # y[:, 0:2] = sigmoid(y[:, 0:2]) as torch exports it (ScatterND), and a Resize with ONNX's default attributes
    part = n.op("Sigmoid", [n.op("Slice", [dcr, n.const([0]), n.const([2]), n.const([1])])])
    where = np.array([[[b, c] for c in (0, 1)] for b in (0, 1)], np.int64)
    dcr = n.op("ScatterND", [dcr, n.init("where", where), part], "scatter")
    crd = n.op("Resize", [crd, "", n.init("scales", np.array([1, 1, 2, 2], np.float32))], "resize_default")
    return model_of(n, [dcr, crd], (2, 3, 16, 16)), {"HardSigmoid", "Maximum", "Minimum", "PReLU", "Conv2DTranspose",
                                                      "Split", "SpaceToDepth", "DepthToSpace", "TensorScatterUpdate",
                                                      "ResizeNearestNeighbor"}


def legacy_style():
    """An opset-9 export: Upsample (nearest and linear) and InstanceNormalization (style-transfer networks)."""
    n = Net(28)
    x = n.op("Relu", [n.conv("input", "c1", 3, 16, stride=2)])                              # 16 x 8 x 8
    x = n.op("InstanceNormalization", [x, n.init("in.scale", n.rng.uniform(.5, 1.5, 16).astype(np.float32)),
                                       n.init("in.bias", n.rng.normal(0, .1, 16).astype(np.float32))], "inorm",
             epsilon=1e-5)
    scales = n.init("up.scales", np.array([1, 1, 2, 2], np.float32))
    a = n.op("Upsample", [x, scales], "up_nearest", mode="nearest")                      # 16 x 16 x 16
    b = n.op("Upsample", [x, scales], "up_linear", mode="linear")
    y = n.conv(n.op("Concat", [a, b], axis=1), "c2", 32, 4, bias=True)
    return model_of(n, [y], (2, 3, 16, 16), opset=9), {"ResizeNearestNeighbor", "ResizeBilinear", "ReduceMean",
                                                      "Sqrt", "Div"}


def transformer_style():
    """A LayerNorm written out (ReduceMean, Sub, Pow, Sqrt, Div), GELU with Erf, a class token taken with Gather,
    shape arithmetic at the fixed input shape (Shape -> Gather -> Unsqueeze -> Concat -> Reshape, ConstantOfShape,
    Expand, Tile), the unary and reducing ops, Identity and Dropout."""
    n = Net(22)
    x = n.conv("input", "patch", 3, 16, k=4, stride=4, pads=[0, 0, 0, 0])                  # B x 16 x 4 x 4
    shape = n.op("Shape", [x])
    batch = n.op("Unsqueeze", [n.op("Gather", [shape, n.const(0)], axis=0), n.const([0])])
    chans = n.op("Unsqueeze", [n.op("Gather", [shape, n.const(1)], axis=0), n.const([0])])
    x = n.op("Reshape", [x, n.op("Concat", [batch, chans, n.const([-1])], axis=0)])         # B x 16 x 16
    x = n.op("Transpose", [x], perm=[0, 2, 1])                                              # B x 16 tokens x 16
    mean = n.op("ReduceMean", [x], axes=[-1], keepdims=1)
    d = n.op("Sub", [x, mean])
    var = n.op("ReduceMean", [n.op("Pow", [d, n.init("two", np.float32(2.0))])], axes=[-1], keepdims=1)
    x = n.op("Div", [d, n.op("Sqrt", [n.op("Add", [var, n.init("eps", np.float32(1e-5))])])])
    x = n.op("Add", [n.op("Mul", [x, n.init("ln.g", n.rng.uniform(.5, 1.5, 16).astype(np.float32))]),
                     n.init("ln.b", n.rng.normal(0, .1, 16).astype(np.float32))])
    h = n.op("MatMul", [x, n.weight("fc1.weight", (16, 32), 16)])
    h = n.op("Mul", [n.op("Mul", [h, n.init("half", np.float32(0.5))]),
                     n.op("Add", [n.op("Erf", [n.op("Div", [h, n.init("sqrt2", np.float32(np.sqrt(2)))])]),
                                  n.init("one", np.float32(1.0))])], "gelu")
    h = n.op("Dropout", [n.op("Identity", [h])])
    cls = n.op("Gather", [h, n.const(0)], "cls_token", axis=1)                             # B x 32
    pair = n.op("Gather", [h, n.const([[1, 3], [2, 2]])], "token_pairs", axis=1)            # B x 2 x 2 x 32
    t = n.op("Tanh", [cls])
    u = n.op("Softplus", [n.op("Neg", [n.op("Abs", [t])])])
    v = n.op("Log", [n.op("Add", [n.op("Exp", [t]), n.init("one2", np.float32(1.0))])])
    w = n.op("Reciprocal", [n.op("Add", [n.op("Max", [u, v, t]), n.init("three", np.float32(3.0))])])
    s = n.op("ReduceSum", [n.op("Min", [u, w]), n.const([1])], keepdims=1)                  # B x 1
    m = n.op("ReduceMax", [n.op("Reshape", [pair, n.const([0, 4, 32])])], axes=[1], keepdims=0)   # B x 32
    ones = n.op("ConstantOfShape", [n.op("Shape", [m])], value=numpy_helper.from_array(np.ones(1, np.float32)))
    y = n.op("Sum", [n.op("Expand", [s, n.op("Shape", [m])]), m, ones])
    y = n.op("Concat", [y, n.op("Tile", [s, n.const([1, 4])])], axis=1)                       # B x 36
    y = n.gemm(y, "head", 36, 10)
    return model_of(n, [y], ("batch", 3, 16, 16)), {"Pow", "Sqrt", "Erf", "Gather", "Tanh", "Softplus", "Neg",
                                                    "Abs", "Exp", "Log", "Reciprocal", "Maximum", "Minimum",
                                                    "ReduceSum", "ReduceMax", "BroadcastTo", "Tile"}


def crnn_style():
    """A CRNN as torch exports it: convolutions, the feature map to a sequence with shapes computed from Shape, a
    bidirectional LSTM (Y and the last hidden state Y_h used) whose initial states are ConstantOfShape of a
    shape computed at run time, a GRU in reverse (linear_before_reset 1, PyTorch's), a Gemm over every step; the
    declared output [1, seqlen] is stale (the model computes [T, B, classes])."""
    n = Net(23)
    hid = 8
    x = n.op("Relu", [n.conv("input", "c1", 1, 32, stride=2)])                              # B x 32 x 4 x W/2
    x = n.conv(x, "c2", 32, 8, k=1, bias=True)
    shape = n.op("Shape", [x])
    width = n.op("Unsqueeze", [n.op("Gather", [shape, n.const(3)], axis=0), n.const([0])])
    batch = n.op("Unsqueeze", [n.op("Gather", [shape, n.const(0)], axis=0), n.const([0])])
    feat = n.op("Unsqueeze", [n.op("Mul", [n.op("Gather", [shape, n.const(1)], axis=0),
                                         n.op("Gather", [shape, n.const(2)], axis=0)]), n.const([0])])
    x = n.op("Transpose", [n.op("Reshape", [x, n.op("Concat", [batch, feat, width], axis=0)])], perm=[2, 0, 1])
    state_shape = n.op("Concat", [n.const([2]), batch, n.const([hid])], axis=0)
    zeros = n.op("ConstantOfShape", [state_shape], value=numpy_helper.from_array(np.zeros(1, np.float32)))
    r = n.rng
    w = n.init("lstm.W", (r.normal(size=(2, 4 * hid, 32)) * .3).astype(np.float32))
    rr = n.init("lstm.R", (r.normal(size=(2, 4 * hid, hid)) * .3).astype(np.float32))
    b = n.init("lstm.B", (r.normal(size=(2, 8 * hid)) * .1).astype(np.float32))
    y, y_h, _ = n.op("LSTM", [x, w, rr, b, "", zeros, zeros], "lstm", outputs=3, hidden_size=hid,
                     direction="bidirectional")
    seq = n.op("Reshape", [n.op("Transpose", [y], perm=[0, 2, 1, 3]), n.const([0, 0, -1])])   # T x B x 2H
    gw = n.init("gru.W", (r.normal(size=(1, 3 * hid, 2 * hid)) * .3).astype(np.float32))
    gr = n.init("gru.R", (r.normal(size=(1, 3 * hid, hid)) * .3).astype(np.float32))
    gb = n.init("gru.B", (r.normal(size=(1, 6 * hid)) * .1).astype(np.float32))
    g = n.op("GRU", [seq, gw, gr, gb], "gru", outputs=1, hidden_size=hid, direction="reverse", linear_before_reset=1)
    g = n.op("Squeeze", [g, n.const([1])])                                                     # T x B x H
    h = n.op("Reshape", [n.op("Transpose", [y_h], perm=[1, 0, 2]), n.const([0, -1])])          # B x 2H
    t = n.op("Add", [g, n.op("Unsqueeze", [n.op("MatMul", [h, n.weight("hproj", (2 * hid, hid), 2 * hid)]),
                                            n.const([0])])])
    flat = n.op("Reshape", [t, n.const([-1, hid])])
    logits = n.gemm(flat, "fc", hid, 12)
    steps = n.op("Unsqueeze", [n.op("Gather", [n.op("Shape", [t]), n.const(0)], axis=0), n.const([0])])
    out = n.op("Reshape", [logits, n.op("Concat", [steps, batch, n.const([12])], axis=0)], "logits")
    return model_of(n, [out], ("batch", 1, 8, "width"), output_shapes={out: [1, "seqlen"]}), \
        {"DynamicRNN", "DynamicGRUV2", "Stack", "StridedSlice", "MatMul"}


GRAPHS = {"paddle_style": (paddle_style, (2, 3, 16, 16)), "transformer_style": (transformer_style, (2, 3, 16, 16)),
          "crnn_style": (crnn_style, (1, 1, 8, 24)), "legacy_style": (legacy_style, (2, 3, 16, 16))}
# the ops a deploy MindIR holds as such (HardSigmoid comes back as Muls, Add, Maximum, Minimum, an unequal Split as
# slices, a CRD DepthToSpace as Reshape / Transpose)
IN_MINDIR = {"paddle_style": {"Conv2DTranspose", "SpaceToDepth", "DepthToSpace", "PReLU", "Maximum", "Minimum",
                              "TensorScatterUpdate"},
             "transformer_style": {"Pow", "Sqrt", "Erf", "Tanh", "Softplus", "Exp", "Log", "Neg", "Abs", "Reciprocal",
                                   "Gather", "ReduceSum", "ReduceMax", "BroadcastTo", "Tile"},
             "crnn_style": {"DynamicRNN", "DynamicGRUV2", "Stack"},
             "legacy_style": {"ResizeNearestNeighbor", "ResizeBilinearV2", "ReduceMean", "Sqrt"}}


@pytest.fixture(scope="module", params=list(GRAPHS))
def case(request):
    build, shape = GRAPHS[request.param]
    model, ops = build()
    graph = read_onnx(model, input_shape=shape)
    return request.param, model, graph, ops, shape


def images(shape, count=8, seed=0):
    return np.random.default_rng(seed).normal(size=(count,) + tuple(shape[1:])).astype(np.float32)


def test_ir_matches_onnxruntime_on_the_file_as_given(case):
    name, model, graph, ops, shape = case
    assert ops <= set(graph.op_counts()), graph.op_counts()
    assert not set(graph.op_counts()) & {"Identity", "Dropout", "Shape", "ConstantOfShape", "Cast"}
    x = images(shape)
    got = float_runner(graph).run(x)
    for i, o in enumerate(graph.outputs):
        want = np.concatenate([ort_outputs(model, x[s:s + shape[0]])[i] for s in range(0, len(x), shape[0])])
        assert got[o].shape == want.shape
        np.testing.assert_allclose(got[o], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def quantized(graph, shape):
    """Calibrated: every layer reading more than 16 channels is INT8 (CANN runs those of 16 or fewer in float16;
    the graphs give such layers no bias, so that which precision they get does not matter to these tests)."""
    folded = fold_for_quantization(graph)
    qp = calibrate(folded, [images(shape, 16, seed=1)], "minmax")
    assert qp.ops, "the graph quantizes its convolutions"
    return folded, qp


@pytest.mark.parametrize("seed", [2, 4])
def test_emulation_equals_the_deploy_interpreter_bit_for_bit(case, seed):
    """deploy.onnx run node by node on float16 values computes what the emulation computes.  Every convolution and
    matrix product is INT8 (exact integers), so each float op sees the same float16 inputs in both: a float32
    convolution's summation order follows onnxruntime's kernel choice, which is not the ops' subject here."""
    name, _, graph, _, shape = case
    deploy = quantized_graph(*quantized(graph, shape))
    model = deploy_model(deploy, "x")
    check_deploy(model)
    x16 = images(shape, shape[0], seed=seed).astype(np.float16)
    emulated = Emulator(deploy).outputs(x16)
    for o, got in zip(deploy.outputs, deploy_interpreter.run(model, x16)):
        np.testing.assert_array_equal(got, emulated[o])


def test_deploy_mindir_read_back_computes_the_same(case, tmp_path):
    name, _, graph, _, shape = case
    deploy = quantized_graph(*quantized(graph, shape))
    assert export_deploy_mindir(deploy, tmp_path)["deploy_mindir"] == "deploy.mindir"
    back = read_mindir(tmp_path / "deploy.mindir")
    assert IN_MINDIR[name] <= set(back.op_counts()), back.op_counts()
    x16 = images(shape, shape[0], seed=3).astype(np.float16)
    want, got = Emulator(deploy).outputs(x16), Emulator(back).outputs(x16)
    for mine, theirs in zip(deploy.outputs, back.outputs):
        np.testing.assert_array_equal(got[theirs], want[mine])


# ----------------------------------------------------------------------------- shapes

def test_every_shape_is_known_at_the_fixed_input_shape_whatever_the_file_declares():
    """Dynamic batch and width, a Reshape target computed from Shape, stale value_info and a stale declared output:
    the IR's shapes are what the model computes at the fixed input shape."""
    model, _ = crnn_style()
    model.graph.value_info.append(helper.make_tensor_value_info("c2_out", TensorProto.FLOAT, [1, 8, 4, 12]))  # stale
    graph = read_onnx(model, input_shape=(1, 1, 8, 40))
    assert graph.tensors[graph.outputs[0]].shape == (20, 1, 12)
    assert all(all(d > 0 for d in graph.shape(t)) for node in graph.nodes for t in node.outputs)
    with pytest.raises(UnsupportedNetworkError, match=r"input 'input' has a dynamic shape \[batch, 1, 8, width\]"):
        read_onnx(model)


def test_a_sequence_output_runs_image_by_image_as_the_graph_stage_checks_it(tmp_path):
    """(T, batch, classes) has no leading batch axis: at batch 1 the IR's runner and the graph stage's onnxruntime
    reference both stack whole per-image outputs; a larger batch is refused, naming the output."""
    model, _ = crnn_style()
    onnx.save(model, tmp_path / "crnn.onnx")
    graph = read_onnx(tmp_path / "crnn.onnx", input_shape=(1, 1, 8, 24))
    x = images((1, 1, 8, 24), 3)
    want = onnxruntime_outputs(tmp_path / "crnn.onnx", x, 1)
    got = float_runner(graph).run(x)[graph.outputs[0]]
    assert want.shape == got.shape == (3 * 12, 1, 12)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    with pytest.raises(UnsupportedNetworkError, match=r"graph output 'logits_out' has shape \[12, 2, 12\] at input "
                                                      r"batch 2, without the batch as its first axis.*batch.* to 1"):
        read_onnx(model, input_shape=(2, 1, 8, 24))


# ----------------------------------------------------------------------------- what is refused, and how

def test_an_already_quantized_model_is_refused_asking_for_the_float_one():
    n = Net(24)
    q, scale, zero = n.op("DynamicQuantizeLinear", ["input"], "input_quant", outputs=3)
    w = n.init("w_q", np.ones((4, 3, 3, 3), np.uint8))
    acc = n.op("ConvInteger", [q, w, zero, n.init("w_zero", np.uint8(0))], "conv_int", pads=[1, 1, 1, 1])
    y = n.op("Mul", [n.op("Cast", [acc], to=TensorProto.FLOAT), scale])
    model = model_of(n, [y], (1, 3, 8, 8))
    with pytest.raises(UnsupportedNetworkError, match=r"is already quantized: it computes with (DynamicQuantizeLinear "
                                                      r"x1, ConvInteger x1|ConvInteger x1, DynamicQuantizeLinear x1) "
                                                      r"\(first at node input_quant\).*the float \(FP32\) model"):
        read_onnx(model)
    n = Net(25)   # QDQ: a QuantizeLinear / DequantizeLinear pair on the activations
    qx = n.op("QuantizeLinear", ["input", n.init("s", np.float32(0.1)), n.init("z", np.uint8(128))], "qdq_q")
    x = n.op("DequantizeLinear", [qx, "s", "z"], "qdq_dq")
    with pytest.raises(UnsupportedNetworkError, match=r"already quantized: it computes with QuantizeLinear x1"):
        read_onnx(model_of(n, [n.op("Relu", [n.conv(x, "c", 3, 4)])], (1, 3, 8, 8)))


@pytest.mark.parametrize("attrs, message", [
    ({"linear_before_reset": 0}, r"linear_before_reset 0: CANN's DynamicGRUV2 applies the reset gate after"),
    ({"linear_before_reset": 1, "clip": 3.0}, r"clip 3.0: CANN's ONNX parser does not pass it on"),
    ({"linear_before_reset": 1, "activations": ["Sigmoid", "Relu"]}, r"activations \['Sigmoid', 'Relu'\]"),
])
def test_a_recurrent_layer_the_device_would_compute_otherwise_is_refused(attrs, message):
    n = Net(26)
    x = n.op("Squeeze", [n.op("Transpose", [n.conv("input", "c", 1, 4, k=1)], perm=[2, 0, 1, 3]), n.const([3])])
    r = n.rng
    y = n.op("GRU", [x, n.init("W", r.normal(size=(1, 12, 4)).astype(np.float32)),
                     n.init("R", r.normal(size=(1, 12, 4)).astype(np.float32))], "my_gru", hidden_size=4, **attrs)
    with pytest.raises(UnsupportedNetworkError, match=r"ONNX node my_gru .*" + message):
        read_onnx(model_of(n, [y], (1, 1, 6, 1)))


def test_unsupported_op_message_names_the_op_and_node():
    n = Net(27)
    y = n.op("Hardmax", [n.conv("input", "c", 3, 4, k=1)], "my_hardmax", axis=1)
    with pytest.raises(UnsupportedNetworkError, match=r"unsupported ONNX op 'Hardmax' \(domain ai.onnx, the default\) "
                                                      r"at node my_hardmax: quantflow cannot run or quantize it. Fix: "
                                                      r".*\(supported ONNX ops: .*LSTM"):
        read_onnx(model_of(n, [y], (1, 3, 8, 8)))


def test_a_model_exported_in_half_precision_is_read_in_float32_and_checked(tmp_path):
    """float16 weights and input (a half-precision export): the IR holds them in float32 (the emulation models the
    device's float16 itself) and the graph stage's onnxruntime reference feeds the file float16."""
    n = Net(29)
    w = n.init("w16", (n.rng.normal(size=(8, 3, 3, 3)) * .3).astype(np.float16))
    y = n.op("Sigmoid", [n.op("Conv", ["input", w, n.init("b16", np.full(8, .1, np.float16))], "c", pads=[1] * 4)])
    graph = helper.make_graph(n.nodes, "half", [helper.make_tensor_value_info("input", TensorProto.FLOAT16,
                                                                              ["n", 3, 8, 8])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT16, ["n", 8, 8, 8])], n.inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "half.onnx")
    ir = read_onnx(tmp_path / "half.onnx", input_shape=(1, 3, 8, 8))
    assert ir.initializers["w16"].dtype == np.float32 and ir.tensors[ir.outputs[0]].dtype == "float32"
    x = images((1, 3, 8, 8), 4)
    want = onnxruntime_outputs(tmp_path / "half.onnx", x, 1)
    np.testing.assert_allclose(float_runner(ir).run(x)[ir.outputs[0]], want, atol=2e-3)
