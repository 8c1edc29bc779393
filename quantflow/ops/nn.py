"""Convolution, matrix products, normalization and pooling."""
from __future__ import annotations

import numpy as np

from .common import as_ints, data_format, norm_axis, pad_mode, pair, spatial_pads
from .quant import int8_cube_onnx
from .registry import OpDef, register


# ----------------------------------------------------------------------------- Conv2D

def _conv_from_mindir(ctx):
    if data_format(ctx.attr("format")) != "NCHW":
        ctx.fail("only NCHW convolutions are supported")
    w = ctx.tensor(1)
    kh, kw = ctx.shape(w)[2:]
    stride, dilation = pair(ctx.attr("stride", 1)), pair(ctx.attr("dilation", 1))
    if ctx.attr("pad_list") is not None:  # MindSpore's own inference of the pads, for every pad mode
        t, b, l, r = (int(p) for p in ctx.attr("pad_list"))
        pads = [t, l, b, r]
    else:
        pads = spatial_pads(pad_mode(ctx.attr("pad_mode", "valid")), ctx.shape(ctx.tensor(0))[2:], (kh, kw), stride,
                            dilation, ctx.attr("pad", (0, 0, 0, 0)), ctx.node_name)
    attrs = {"pads": pads, "strides": list(stride), "dilations": list(dilation), "group": int(ctx.attr("group", 1))}
    if ctx.reader.initializers.get(w) is not None and ctx.reader.initializers[w].dtype == np.int8:
        # a deploy graph's int8 convolution; its input zero point rides on the primitive as offset_a
        attrs.update(offset_x=int(ctx.attr("offset_a", 0)), channel_axis=0, out_rank=4)
    return [ctx.tensor(0), w], attrs


def _conv_float(node, b):
    a = node.attrs
    b.add("Conv", node.inputs, node.outputs[0], pads=a["pads"], strides=a["strides"], dilations=a["dilations"],
          group=a["group"])


def _conv_onnx(node, b):
    if "offset_x" not in node.attrs:
        _conv_float(node, b)
        return
    a = node.attrs
    int8_cube_onnx(node, b, _conv_float, "Conv", dict(name=node.label, pads=a["pads"], strides=a["strides"],
                                                      dilations=a["dilations"], group=a["group"]))


register(OpDef("Conv2D", _conv_from_mindir, _conv_onnx, quantizable=True))


# ----------------------------------------------------------------------------- MatMul / BatchMatMul

def _matmul_from_mindir(ctx):
    return [ctx.tensor(0), ctx.tensor(1)], {"transpose_a": bool(ctx.get(2, "transpose_a", False)),
                                            "transpose_b": bool(ctx.get(3, "transpose_b", False))}


def _swap_last(b, x: str, rank: int) -> str:
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return b.add("Transpose", [x], perm=perm)


def _matmul_onnx(node, b):
    if "offset_x" in node.attrs:
        int8_cube_onnx(node, b, _matmul_float, "Gemm", dict(name=node.label, transB=int(node.attrs["transpose_b"])))
    else:
        _matmul_float(node, b)


def _matmul_float(node, b):
    x, w = node.inputs[:2]
    ra, rb = node.attrs["rank_a"], node.attrs["rank_b"]
    if node.attrs["transpose_a"]:
        x = _swap_last(b, x, ra)
    if node.attrs["transpose_b"]:
        w = _swap_last(b, w, rb)
    if len(node.inputs) == 3:  # bias fused by the BiasAdd pass
        y = b.add("MatMul", [x, w])
        b.add("Add", [y, node.inputs[2]], node.outputs[0])
    else:
        b.add("MatMul", [x, w], node.outputs[0])


def _with_ranks(parse):
    def wrapped(ctx):
        inputs, attrs = parse(ctx)
        attrs["rank_a"], attrs["rank_b"] = len(ctx.shape(inputs[0])), len(ctx.shape(inputs[1]))
        return inputs, attrs
    return wrapped


register(OpDef("MatMul", _with_ranks(_matmul_from_mindir), _matmul_onnx, quantizable=True))
register(OpDef("BatchMatMul", _with_ranks(_matmul_from_mindir), _matmul_onnx))


# ----------------------------------------------------------------------------- BiasAdd

def _bias_from_mindir(ctx):
    fmt = data_format(ctx.get(2, "data_format", ctx.attr("format", "NCHW")))
    rank = len(ctx.shape(ctx.tensor(0)))
    axis = 1 if fmt == "NCHW" or rank == 2 else rank - 1
    return [ctx.tensor(0), ctx.tensor(1)], {"axis": axis, "rank": rank}


def _channel_view(b, t: str, axis: int, rank: int) -> str:
    """A (C,) tensor reshaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    shape = [1] * rank
    shape[axis] = -1
    return b.add("Reshape", [t, b.const(np.array(shape, np.int64), "shape")])


def _bias_onnx(node, b):
    a = node.attrs
    b.add("Add", [node.inputs[0], _channel_view(b, node.inputs[1], a["axis"], a["rank"])], node.outputs[0])


register(OpDef("BiasAdd", _bias_from_mindir, _bias_onnx))


# ----------------------------------------------------------------------------- BatchNorm (inference)

def _bn_from_mindir(ctx):
    if ctx.get(5, "is_training", False):
        ctx.fail("BatchNorm in training mode (call set_train(False) before exporting)")
    if data_format(ctx.get(8, "data_format", ctx.attr("format", "NCHW"))) != "NCHW":
        ctx.fail("only NCHW BatchNorm is supported")
    ctx.only_output(0)
    return [ctx.tensor(i) for i in range(5)], {"epsilon": float(ctx.get(6, "epsilon", 1e-5))}


def _bn_onnx(node, b):
    b.add("BatchNormalization", node.inputs, node.outputs[0], epsilon=node.attrs["epsilon"])


register(OpDef("BatchNorm", _bn_from_mindir, _bn_onnx, num_outputs=lambda a: 5, exact_in_fp16=False))


# ----------------------------------------------------------------------------- LayerNorm

def _ln_from_mindir(ctx):
    x = ctx.tensor(0)
    rank = len(ctx.shape(x))
    axis = norm_axis(int(ctx.get(3, "begin_norm_axis", 1)), rank)
    paxis = norm_axis(int(ctx.get(4, "begin_params_axis", 1)), rank)
    if axis != paxis:
        ctx.fail(f"LayerNorm with begin_norm_axis {axis} != begin_params_axis {paxis}")
    ctx.only_output(0)
    return [x, ctx.tensor(1), ctx.tensor(2)], {"axis": axis, "rank": rank,
                                               "epsilon": float(ctx.get(5, "epsilon", 1e-7))}


def _ln_onnx(node, b):
    x, gamma, beta = node.inputs
    axis, eps = node.attrs["axis"], node.attrs["epsilon"]
    if b.opset >= 17:
        b.add("LayerNormalization", node.inputs, node.outputs[0], axis=axis, epsilon=eps)
        return
    axes = list(range(axis, node.attrs["rank"]))  # older opsets: the definition, step by step
    d = b.add("Sub", [x, b.add("ReduceMean", [x], axes=axes, keepdims=1)])
    var = b.add("ReduceMean", [b.add("Mul", [d, d])], axes=axes, keepdims=1)
    norm = b.add("Div", [d, b.add("Sqrt", [b.add("Add", [var, b.const(np.float32(eps), "eps")])])])
    b.add("Add", [b.add("Mul", [norm, gamma]), beta], node.outputs[0])


register(OpDef("LayerNorm", _ln_from_mindir, _ln_onnx, num_outputs=lambda a: 3, exact_in_fp16=False))


# ----------------------------------------------------------------------------- Softmax

def _softmax_from_mindir(ctx):
    axis = as_ints(ctx.get(1, "axis", -1))
    if len(axis) != 1:
        ctx.fail(f"Softmax over several axes {axis}")
    return [ctx.tensor(0)], {"axis": axis[0]}


register(OpDef("Softmax", _softmax_from_mindir,
               lambda n, b: b.add("Softmax", n.inputs, n.outputs[0], axis=n.attrs["axis"]), exact_in_fp16=False))


# ----------------------------------------------------------------------------- ReduceMean

def _reduce_from_mindir(ctx):
    x = ctx.tensor(0)
    rank = len(ctx.shape(x))
    axes = as_ints(ctx.get(1, "axis", ()))
    axes = sorted(norm_axis(a, rank) for a in axes) or list(range(rank))
    return [x], {"axes": axes, "keepdims": bool(ctx.get(2, "keep_dims", False))}


register(OpDef("ReduceMean", _reduce_from_mindir,
               lambda n, b: b.add("ReduceMean", n.inputs, n.outputs[0], axes=n.attrs["axes"],
                                  keepdims=int(n.attrs["keepdims"])), exact_in_fp16=False))


# ----------------------------------------------------------------------------- pooling

def _pool_from_mindir(ctx):
    fmt = data_format(ctx.get(4, "data_format", ctx.attr("format", "NCHW")))
    if fmt != "NCHW":
        ctx.fail("only NCHW pooling is supported")
    x = ctx.tensor(0)
    k, s = pair(ctx.get(1, "kernel_size", 1)), pair(ctx.get(2, "strides", 1))
    mode = pad_mode(ctx.get(3, "pad_mode", "valid"))
    pads = spatial_pads(mode, ctx.shape(x)[2:], k, s, node=ctx.node_name)
    return [x], {"kernel": list(k), "strides": list(s), "pads": pads}


def _maxpool_onnx(node, b):
    a = node.attrs
    b.add("MaxPool", node.inputs, node.outputs[0], kernel_shape=a["kernel"], strides=a["strides"], pads=a["pads"])


def _avgpool_onnx(node, b):
    # MindSpore's AvgPool divides by the number of real (unpadded) pixels in the window
    a = node.attrs
    b.add("AveragePool", node.inputs, node.outputs[0], kernel_shape=a["kernel"], strides=a["strides"],
          pads=a["pads"], count_include_pad=0)


register(OpDef("MaxPool", _pool_from_mindir, _maxpool_onnx))
register(OpDef("AvgPool", _pool_from_mindir, _avgpool_onnx, exact_in_fp16=False))


def _adaptive_from_mindir(ctx):
    x = ctx.tensor(0)
    h, w = ctx.shape(x)[2:]
    size = ctx.get(1, "output_size", None)
    oh, ow = ctx.out_shape(0)[2:]
    if h % oh or w % ow:
        ctx.fail(f"AdaptiveAvgPool2D from {h}x{w} to {oh}x{ow}: only whole-number pooling windows are supported "
                 f"(output_size {size})")
    return [x], {"kernel": [h // oh, w // ow], "strides": [h // oh, w // ow], "pads": [0, 0, 0, 0]}


register(OpDef("AdaptiveAvgPool2D", _adaptive_from_mindir, _avgpool_onnx, exact_in_fp16=False))
