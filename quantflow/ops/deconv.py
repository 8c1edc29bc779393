"""Transposed convolution (DBNet's FPN upsampling, YOLO-seg's mask prototypes), a float16 op.

Not quantized: CANN's quant passes for transposed convolutions match ``Conv2DTransposeD`` / ``Deconvolution``
(FE ``Conv2DTDQuantProcessFusionPass``, ``DeConvQuantProcessFusionPass``), while CANN's ONNX parser turns a
ConvTranspose into ``Conv2DTranspose`` and converts it to ``Conv2DTransposeD`` only in a built-in graph pass that
runs after the quant passes (``const2attr_fusion_pass.cc`` vs ``fe_graph_optimizer.cc`` OptimizeOriginalGraph:
``FusionQuantOp`` before the built-in passes).  Whether an ONNX deploy graph's ConvTranspose is ever quantized
by atc is therefore not established, so quantflow keeps it in float16, where it is what the device runs.

IR attributes: ``pads`` [top, left, bottom, right], ``strides``, ``dilations``, ``group`` and ``output_padding``
[h, w] (extra rows / columns at the end), so that the output is
``stride * (in - 1) + output_padding + (kernel - 1) * dilation + 1 - pad_begin - pad_end``.  The weight is
(C_in, C_out / group, kh, kw) in both ONNX and MindSpore.
"""
from __future__ import annotations

from .common import pad_mode, pair, spatial_pads
from .registry import OpDef, register


def _from_mindir(ctx):
    """MindSpore's Conv2DTranspose / Conv2DBackpropInput(dout, weight, input_size)."""
    if str(ctx.attr("format", "NCHW")).upper() not in ("NCHW", "0"):
        ctx.fail("only NCHW transposed convolutions are supported")
    x, w = ctx.tensor(0), ctx.tensor(1)
    kh, kw = ctx.shape(w)[2:]
    stride, dilation = pair(ctx.attr("stride", 1)), pair(ctx.attr("dilation", 1))
    size = [int(v) for v in ctx.get(2, "input_size", ())][2:] or list(ctx.out_shape(0)[2:])
    hw = ctx.shape(x)[2:]
    if ctx.attr("pad_list") is not None and any(int(p) for p in ctx.attr("pad_list")):
        t, b, l, r = (int(p) for p in ctx.attr("pad_list"))
        pads = [t, l, b, r]
    else:  # the forward convolution's pads for the output size
        pads = spatial_pads(pad_mode(ctx.attr("pad_mode", "valid")), tuple(size), (kh, kw), stride, dilation,
                            ctx.attr("pad", (0, 0, 0, 0)), ctx.node_name)
    extra = [size[i] - (stride[i] * (hw[i] - 1) + (ctx.shape(w)[2 + i] - 1) * dilation[i] + 1 - pads[i] - pads[i + 2])
             for i in range(2)]
    if min(extra) < 0:
        ctx.fail(f"output size {size} is smaller than the transposed convolution of {hw} gives")
    return [x, w], {"pads": pads, "strides": list(stride), "dilations": list(dilation),
                    "group": int(ctx.attr("group", 1)), "output_padding": extra}


def _onnx(node, b):
    a = node.attrs
    b.add("ConvTranspose", node.inputs[:2], node.outputs[0], pads=a["pads"], strides=a["strides"],
          dilations=a["dilations"], group=a["group"], output_padding=a["output_padding"])


def _ms(node, w):
    a = node.attrs
    t, l, b, r = a["pads"]
    cin, cout_g, kh, kw = w.array(node, 1).shape
    out = tuple(w.graph.tensors[node.outputs[0]].shape)
    prim = (f"ops.Conv2DTranspose({cout_g * a['group']}, ({kh}, {kw}), pad_mode='pad', pad=({t}, {b}, {l}, {r}), "
            f"stride={tuple(a['strides'])}, dilation={tuple(a['dilations'])}, group={a['group']})")
    return f"{w.prim(prim)}({w.x(node, 0)}, {w.x(node, 1)}, {out})"


for _name in ("Conv2DTranspose", "Conv2DBackpropInput"):
    register(OpDef(_name, _from_mindir, _onnx, exact_in_fp16=False, to_mindspore=_ms))
