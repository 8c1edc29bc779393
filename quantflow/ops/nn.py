"""Convolution, matrix products, normalization and pooling."""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedNetworkError
from .common import as_ints, data_format, norm_axis, pad_mode, pair, spatial_pads
from .quant import device_offset_x, int8_cube_onnx
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
        # a deploy graph's int8 convolution: its input zero point is what the device sets, offset_x = the offset of
        # the AscendQuant that feeds it (through at most a Pad; FE's Conv2D quant pass, see quant.device_offset_x)
        attrs.update(offset_x=device_offset_x(ctx.reader.nodes, ctx.tensor(0)), channel_axis=0, out_rank=4)
    return [ctx.tensor(0), w], attrs


def _kernel_shape(node, b) -> dict:
    """``kernel_shape`` of a Conv whose weight is a constant (CANN's Conv ONNX plugin needs at least one of
    kernel_shape/pads/strides/dilations to tell 1-D from 2-D; conv_plugin.cc: write it always)."""
    w = b.initializers.get(node.inputs[1])
    return {"kernel_shape": list(w.shape[2:])} if w is not None else {}


def _conv_float(node, b):
    a = node.attrs
    b.add("Conv", node.inputs, node.outputs[0], pads=a["pads"], strides=a["strides"], dilations=a["dilations"],
          group=a["group"], **_kernel_shape(node, b))


def _conv_onnx(node, b):
    if "offset_x" not in node.attrs or b.target == "device":
        # a float convolution, or the deploy graph's int8 Conv (int8 input and weight, int32 bias; no offset: CANN's
        # quant pass sets offset_x from the adjacent AscendQuant)
        _conv_float(node, b)
        return
    a = node.attrs

    def integer(b, x, w, x_zero, w_zero):
        return b.add("ConvInteger", [x, b.const(w, "weight_u8"), x_zero, w_zero], pads=a["pads"],
                     strides=a["strides"], dilations=a["dilations"], group=a["group"])
    int8_cube_onnx(node, b, integer, float_lowering=_conv_float)  # where exact: faster in onnxruntime (quant.py)


def _conv_ms(node, w):
    a = node.attrs
    t, l, b, r = a["pads"]
    cout, _, kh, kw = w.array(node, 1).shape
    # an int8 convolution carries no offset: MindSpore's GE adapter drops Conv2D's offset_a (ATTR_MAP(Conv2D) in
    # nn_calculation_ops_declare.cc); FE's quant pass sets offset_x from the adjacent AscendQuant
    prim = (f"ops.Conv2D({cout}, ({kh}, {kw}), pad_mode='pad', pad=({t}, {b}, {l}, {r}), "
            f"stride={tuple(a['strides'])}, dilation={tuple(a['dilations'])}, group={a['group']})")
    y = f"{w.prim(prim)}({w.x(node, 0)}, {w.x(node, 1)})"
    return f"{w.prim('ops.BiasAdd()')}({y}, {w.x(node, 2)})" if len(node.inputs) == 3 else y


register(OpDef("Conv2D", _conv_from_mindir, _conv_onnx, quantizable=True, to_mindspore=_conv_ms))


# ----------------------------------------------------------------------------- MatMul / BatchMatMul

def _matmul_from_mindir(ctx):
    return [ctx.tensor(0), ctx.tensor(1)], {"transpose_a": bool(ctx.get(2, "transpose_a", False)),
                                            "transpose_b": bool(ctx.get(3, "transpose_b", False))}


def _swap_last(b, x: str, rank: int) -> str:
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return b.add("Transpose", [x], perm=perm)


def _matmul_onnx(node, b):
    if "offset_x" not in node.attrs:
        _matmul_float(node, b)
    elif b.target == "device":
        # Gemm with transB = 0 and the int8 weight as [K, N]: CANN maps Gemm to MatMulV2, whose quant pass reads
        # the output channels from the weight's dim[1] and not transpose_x2 (matmulv2_quant_process_fusion_pass.cc
        # GetCoValue); msmodelslim writes quantized Gemm so (squant_ptq/quant_deploy.py _convert_gemm)
        w = node.inputs[1]
        if node.attrs["transpose_b"]:
            w = b.const(np.ascontiguousarray(b.initializers[w].T), "weight_int8_kn")
        b.add("Gemm", [node.inputs[0], w] + node.inputs[2:], node.outputs[0], transB=0)
    else:
        int8_cube_onnx(node, b, _matmul_integer(node))


def _matmul_integer(node):
    a = node.attrs

    def integer(b, x, w, x_zero, w_zero):
        if a["transpose_a"]:
            x = _swap_last(b, x, a["rank_a"])
        if a["transpose_b"]:
            w = np.swapaxes(w, -1, -2)
        return b.add("MatMulInteger", [x, b.const(np.ascontiguousarray(w), "weight_u8"), x_zero, w_zero])
    return integer


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


def _matmul_ms(node, w):
    a = node.attrs
    bias = len(node.inputs) == 3
    if "offset_x" in a:
        # int8: a 1x1 Conv2D on the (N, K, 1, 1) int8 input, int32 out (MindSpore's MatMul keeps int8 output).  The
        # reshapes are on the float side of AscendQuant and AscendDequant (their to_mindspore), so that
        # AscendQuant -> Conv2D -> AscendDequant stay adjacent, the pattern CANN's quant pass needs to set offset_x
        wq = w.array(node, 1)
        wq = wq if a["transpose_b"] else wq.T
        n, k = wq.shape
        y = f"{w.prim(f'ops.Conv2D({n}, 1)')}({w.x(node, 0)}, {w.param(wq.reshape(n, k, 1, 1))})"
        return f"{w.prim('ops.BiasAdd()')}({y}, {w.x(node, 2)})" if bias else y
    name = "BatchMatMul" if node.op == "BatchMatMul" else "MatMul"
    op = w.prim(f"ops.{name}({a['transpose_a']}, {a['transpose_b']})")
    y = f"{op}({w.x(node, 0)}, {w.x(node, 1)})"
    return f"({y} + {w.x(node, 2)})" if bias else y


register(OpDef("MatMul", _with_ranks(_matmul_from_mindir), _matmul_onnx, quantizable=True, to_mindspore=_matmul_ms))
register(OpDef("BatchMatMul", _with_ranks(_matmul_from_mindir), _matmul_onnx, to_mindspore=_matmul_ms))


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


def _bias_ms(node, w):
    if node.attrs["axis"] == 1 and node.attrs["rank"] > 2:
        return f"{w.prim('ops.BiasAdd()')}({w.x(node, 0)}, {w.x(node, 1)})"
    return f"({w.x(node, 0)} + {w.x(node, 1)})"  # the channel axis is the last one: plain broadcasting


register(OpDef("BiasAdd", _bias_from_mindir, _bias_onnx, to_mindspore=_bias_ms))


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


def _bn_ms(node, w):
    bn = w.prim(f"ops.BatchNorm(is_training=False, epsilon={node.attrs['epsilon']!r})")
    args = ", ".join([w.x(node, 0)] + [w.x(node, i, keep_float32=True) for i in range(1, 5)])
    return f"{bn}({args})[0]"


register(OpDef("BatchNorm", _bn_from_mindir, _bn_onnx, num_outputs=lambda a: 5, exact_in_fp16=False,
               to_mindspore=_bn_ms))


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


def _ln_ms(node, w):
    a = node.attrs
    ln = w.prim(f"ops.LayerNorm(begin_norm_axis={a['axis']}, begin_params_axis={a['axis']}, epsilon={a['epsilon']!r})")
    return f"{ln}({w.x(node, 0)}, {w.x(node, 1)}, {w.x(node, 2)})[0]"


register(OpDef("LayerNorm", _ln_from_mindir, _ln_onnx, num_outputs=lambda a: 3, exact_in_fp16=False,
               to_mindspore=_ln_ms))


# ----------------------------------------------------------------------------- Softmax

def _softmax_from_mindir(ctx):
    axis = as_ints(ctx.get(1, "axis", -1))
    if len(axis) != 1:
        ctx.fail(f"Softmax over several axes {axis}")
    return [ctx.tensor(0)], {"axis": axis[0]}


register(OpDef("Softmax", _softmax_from_mindir,
               lambda n, b: b.add("Softmax", n.inputs, n.outputs[0], axis=n.attrs["axis"]), exact_in_fp16=False,
               to_mindspore=lambda n, w: f"{w.prim('ops.Softmax(%d)' % n.attrs['axis'])}({w.x(n, 0)})"))


# ----------------------------------------------------------------------------- ReduceMean

def _reduce_from_mindir(ctx):
    x = ctx.tensor(0)
    rank = len(ctx.shape(x))
    axes = as_ints(ctx.get(1, "axis", ()))
    axes = sorted(norm_axis(a, rank) for a in axes) or list(range(rank))
    return [x], {"axes": axes, "keepdims": bool(ctx.get(2, "keep_dims", False))}


def _reduce_ms(node, w):
    mean = w.prim(f"ops.ReduceMean(keep_dims={node.attrs['keepdims']})")
    return f"{mean}({w.x(node, 0)}, {tuple(node.attrs['axes'])})"


register(OpDef("ReduceMean", _reduce_from_mindir,
               lambda n, b: b.add("ReduceMean", n.inputs, n.outputs[0], axes=n.attrs["axes"],
                                  keepdims=int(n.attrs["keepdims"])), exact_in_fp16=False, to_mindspore=_reduce_ms))


# ----------------------------------------------------------------------------- pooling

def _pool_from_mindir(ctx):
    fmt = data_format(ctx.get(4, "data_format", ctx.attr("format", "NCHW")))
    if fmt != "NCHW":
        ctx.fail("only NCHW pooling is supported")
    x = ctx.tensor(0)
    k, s = pair(ctx.get(1, "kernel_size", 1)), pair(ctx.get(2, "strides", 1))
    mode = pad_mode(ctx.get(3, "pad_mode", "valid"))
    pads = spatial_pads(mode, ctx.shape(x)[2:], k, s, node=ctx.node_name)
    return [x], {"kernel": list(k), "strides": list(s), "pads": pads, "pad_mode": mode}


def _maxpool_onnx(node, b):
    a = node.attrs
    b.add("MaxPool", node.inputs, node.outputs[0], kernel_shape=a["kernel"], strides=a["strides"], pads=a["pads"])


def _avgpool_onnx(node, b):
    # MindSpore's AvgPool divides by the number of real (unpadded) pixels in the window
    a = node.attrs
    b.add("AveragePool", node.inputs, node.outputs[0], kernel_shape=a["kernel"], strides=a["strides"],
          pads=a["pads"], count_include_pad=0)


def _pool_ms(name: str):
    """MindSpore's pooling primitives take pad modes "VALID" / "SAME" only: explicit pads ("pad") are
    written as a -inf ``ops.pad`` (PadV3) before a VALID MaxPool, and AvgPool (averaging over the real
    pixels) as nn.AvgPool2d with count_include_pad=False, which takes symmetric pads only."""
    def write(node, w):
        a = node.attrs
        k, s, (t, l, b, r) = tuple(a["kernel"]), tuple(a["strides"]), a["pads"]
        if a["pad_mode"] != "pad" or not any(a["pads"]):
            mode = "valid" if a["pad_mode"] == "pad" else a["pad_mode"]
            pool = w.prim(f"ops.{name}(kernel_size={k}, strides={s}, pad_mode={mode.upper()!r})")
            return f"{pool}({w.x(node, 0)})"
        if name == "MaxPool":
            pool = w.prim(f"ops.MaxPool(kernel_size={k}, strides={s}, pad_mode='VALID')")
            return f"{pool}(ops.pad({w.x(node, 0)}, {(l, r, t, b)}, value=float('-inf')))"
        if (t, l) != (b, r):
            raise UnsupportedNetworkError(f"node {node.label}: average pooling with asymmetric pads {a['pads']} "
                                          "(top, left, bottom, right) has no MindSpore form")
        pool = w.prim(f"nn.AvgPool2d({k}, {s}, pad_mode='pad', padding={(t, l)}, count_include_pad=False)")
        return f"{pool}({w.x(node, 0)})"
    return write


register(OpDef("MaxPool", _pool_from_mindir, _maxpool_onnx, to_mindspore=_pool_ms("MaxPool")))
register(OpDef("AvgPool", _pool_from_mindir, _avgpool_onnx, exact_in_fp16=False, to_mindspore=_pool_ms("AvgPool")))


def _adaptive_from_mindir(ctx):
    x = ctx.tensor(0)
    h, w = ctx.shape(x)[2:]
    size = ctx.get(1, "output_size", None)
    oh, ow = ctx.out_shape(0)[2:]
    if h % oh or w % ow:
        ctx.fail(f"AdaptiveAvgPool2D from {h}x{w} to {oh}x{ow}: only whole-number pooling windows are supported "
                 f"(output_size {size})")
    return [x], {"kernel": [h // oh, w // ow], "strides": [h // oh, w // ow], "pads": [0, 0, 0, 0], "pad_mode": "valid"}


register(OpDef("AdaptiveAvgPool2D", _adaptive_from_mindir, _avgpool_onnx, exact_in_fp16=False,
               to_mindspore=_pool_ms("AvgPool")))
