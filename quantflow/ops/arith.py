"""Element-wise binary arithmetic (NumPy broadcasting in both MindSpore and ONNX)."""
from __future__ import annotations

from .registry import OpDef, register


def _binary(ctx):
    return [ctx.operand(0), ctx.operand(1)], {}


def _simple(onnx_op: str):
    return lambda n, b: b.add(onnx_op, n.inputs, n.outputs[0])


def _add_ext_from_mindir(ctx):
    # InplaceAddExt(input, other, alpha): input + alpha * other (ResNet's residual add)
    alpha = float(ctx.get(2, "alpha", 1.0))
    if alpha != 1.0:
        ctx.fail(f"InplaceAddExt with alpha {alpha} (only 1 is supported)")
    return [ctx.operand(0), ctx.operand(1)], {}


def _infix(symbol: str):
    return lambda n, w: f"({w.x(n, 0)} {symbol} {w.x(n, 1)})"


_ONNX = {"+": "Add", "-": "Sub", "*": "Mul", "/": "Div"}
for _names, _parse, _symbol in (
        (("Add", "Adds"), _binary, "+"), (("AddExt", "InplaceAddExt"), _add_ext_from_mindir, "+"),
        (("Sub", "Subs"), _binary, "-"), (("Mul", "Muls"), _binary, "*"),
        (("Div", "RealDiv", "Divs"), _binary, "/")):
    for _name in _names:
        register(OpDef(_name, _parse, _simple(_ONNX[_symbol]), to_mindspore=_infix(_symbol)))

# YOLOv5's box sizes (``(2 * s) ** 2``); in general the device's Pow is not float32 rounded once
register(OpDef("Pow", _binary, _simple("Pow"), exact_in_fp16=False, to_mindspore=_infix("**")))


def _function(ms_fn: str):
    return lambda n, w: f"{ms_fn}({w.x(n, 0)}, {w.x(n, 1)})"


# nn.LeakyReLU(a) is Maximum(x * a, x) in a MindIR (YOLOv3 / v4 / v7-tiny's activation)
register(OpDef("Maximum", _binary, _simple("Max"), to_mindspore=_function("ops.maximum")))
register(OpDef("Minimum", _binary, _simple("Min"), to_mindspore=_function("ops.minimum")))



# ----------------------------------------------------------------------------- unary arithmetic
# (LayerNorm written out by exporters: ReduceMean, Sub, Pow, Sqrt, Div; GELU as x * 0.5 * (1 + Erf(x / sqrt 2)))

def _unary(ctx):
    return [ctx.tensor(0)], {}


def _unary_onnx(onnx_op: str):
    return lambda n, b: b.add(onnx_op, n.inputs, n.outputs[0])


def _prim(ms_prim: str):
    return lambda n, w: f"{w.prim(ms_prim)}({w.x(n, 0)})"


# Sqrt, Neg and Abs are correctly rounded in IEEE arithmetic (float32 then one rounding is the float16 result);
# the transcendental ones are the device kernels' own approximations
for _name, _onnx, _exact in (("Sqrt", "Sqrt", True), ("Neg", "Neg", True), ("Abs", "Abs", True),
                             ("Reciprocal", "Reciprocal", True), ("Exp", "Exp", False), ("Log", "Log", False),
                             ("Erf", "Erf", False)):
    register(OpDef(_name, _unary, _unary_onnx(_onnx), exact_in_fp16=_exact, to_mindspore=_prim(f"ops.{_name}()")))
