"""Reductions over axes beyond ReduceMean (``nn.py``): ReduceSum (an L2 norm or a softmax written out by an
exporter), ReduceMax and ReduceMin (value-preserving, hence exact in float16)."""
from __future__ import annotations

import numpy as np

from .common import as_ints, norm_axis
from .registry import OpDef, register


def _from_mindir(ctx):
    x = ctx.tensor(0)
    rank = len(ctx.shape(x))
    axes = sorted(norm_axis(a, rank) for a in as_ints(ctx.get(1, "axis", ()))) or list(range(rank))
    return [x], {"axes": axes, "keepdims": bool(ctx.get(2, "keep_dims", False))}


def _onnx(onnx_op: str):
    def lower(node, b):
        a = node.attrs
        if onnx_op == "ReduceSum":   # axes an input from opset 13 on
            b.add(onnx_op, [node.inputs[0], b.const(np.array(a["axes"], np.int64), "axes")], node.outputs[0],
                  keepdims=int(a["keepdims"]))
        else:                        # axes an attribute until opset 18
            b.add(onnx_op, node.inputs, node.outputs[0], axes=a["axes"], keepdims=int(a["keepdims"]))
    return lower


def _ms(prim: str):
    def write(node, w):
        op = w.prim(f"ops.{prim}(keep_dims={node.attrs['keepdims']})")
        return f"{op}({w.x(node, 0)}, {tuple(node.attrs['axes'])})"
    return write


register(OpDef("ReduceSum", _from_mindir, _onnx("ReduceSum"), exact_in_fp16=False, to_mindspore=_ms("ReduceSum")))
register(OpDef("ReduceMax", _from_mindir, _onnx("ReduceMax"), to_mindspore=_ms("ReduceMax")))
register(OpDef("ReduceMin", _from_mindir, _onnx("ReduceMin"), to_mindspore=_ms("ReduceMin")))
