"""Element-wise binary arithmetic (NumPy broadcasting in both MindSpore and ONNX)."""
from __future__ import annotations

from .registry import OpDef, register


def _binary(ctx):
    return [ctx.tensor(0), ctx.tensor(1)], {}


def _simple(onnx_op: str):
    return lambda n, b: b.add(onnx_op, n.inputs, n.outputs[0])


def _add_ext_from_mindir(ctx):
    # InplaceAddExt(input, other, alpha): input + alpha * other (ResNet's residual add)
    alpha = float(ctx.get(2, "alpha", 1.0))
    if alpha != 1.0:
        ctx.fail(f"InplaceAddExt with alpha {alpha} (only 1 is supported)")
    return [ctx.tensor(0), ctx.tensor(1)], {}


register(OpDef("Add", _binary, _simple("Add")))
register(OpDef("AddExt", _add_ext_from_mindir, _simple("Add")))
register(OpDef("InplaceAddExt", _add_ext_from_mindir, _simple("Add")))
register(OpDef("Sub", _binary, _simple("Sub")))
register(OpDef("Mul", _binary, _simple("Mul")))
register(OpDef("Div", _binary, _simple("Div")))
register(OpDef("RealDiv", _binary, _simple("Div")))
# tensor-scalar forms (x / 4.0 in a construct): the scalar becomes a constant tensor
register(OpDef("Adds", _binary, _simple("Add")))
register(OpDef("Subs", _binary, _simple("Sub")))
register(OpDef("Muls", _binary, _simple("Mul")))
register(OpDef("Divs", _binary, _simple("Div")))
