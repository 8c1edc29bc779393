"""Element-wise activations."""
from __future__ import annotations

import math

import numpy as np

from .registry import OpDef, register


def _unary(ctx):
    return [ctx.tensor(0)], {}


def _simple(onnx_op: str, **onnx_attrs):
    return lambda n, b: b.add(onnx_op, n.inputs, n.outputs[0], **onnx_attrs)


def _relu6_onnx(node, b):
    b.add("Clip", [node.inputs[0], b.const(0.0, "zero"), b.const(6.0, "six")], node.outputs[0])


def _hswish_onnx(node, b):
    if b.opset >= 14:
        b.add("HardSwish", node.inputs, node.outputs[0])
    else:  # x * hard_sigmoid(x): the definition of HardSwish, for older opsets
        b.add("Mul", [node.inputs[0], b.add("HardSigmoid", node.inputs[:1], alpha=1.0 / 6.0, beta=0.5)],
              node.outputs[0])


def _silu_onnx(node, b):
    b.add("Mul", [node.inputs[0], b.add("Sigmoid", node.inputs[:1])], node.outputs[0])


def _gelu_onnx(node, b):
    # MindSpore's GeLU primitive: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    x = node.inputs[0]
    x3 = b.add("Mul", [b.add("Mul", [x, x]), x])
    inner = b.add("Mul", [b.add("Add", [x, b.add("Mul", [x3, b.const(0.044715, "c")])]),
                          b.const(math.sqrt(2.0 / math.pi), "c")])
    half_x = b.add("Mul", [x, b.const(0.5, "half")])
    b.add("Mul", [half_x, b.add("Add", [b.add("Tanh", [inner]), b.const(1.0, "one")])], node.outputs[0])


def _ms(prim: str):
    return lambda n, w: f"{w.prim(prim)}({w.x(n, 0)})"


def _silu_ms(node, w):
    x = w.x(node, 0)
    return f"({x} * {w.prim('ops.Sigmoid()')}({x}))"


register(OpDef("ReLU", _unary, _simple("Relu"), to_mindspore=_ms("ops.ReLU()")))
register(OpDef("ReLU6", _unary, _relu6_onnx, to_mindspore=_ms("ops.ReLU6()")))
register(OpDef("HSwish", _unary, _hswish_onnx, exact_in_fp16=False, to_mindspore=_ms("ops.HSwish()")))
register(OpDef("HSigmoid", _unary, _simple("HardSigmoid", alpha=1.0 / 6.0, beta=0.5), exact_in_fp16=False,
               to_mindspore=_ms("ops.HSigmoid()")))
register(OpDef("Sigmoid", _unary, _simple("Sigmoid"), exact_in_fp16=False, to_mindspore=_ms("ops.Sigmoid()")))
register(OpDef("SiLU", _unary, _silu_onnx, exact_in_fp16=False, to_mindspore=_silu_ms))
register(OpDef("GeLU", _unary, _gelu_onnx, exact_in_fp16=False, to_mindspore=_ms("ops.GeLU()")))


# ----------------------------------------------------------------------------- HardSigmoid, any slope
# ONNX HardSigmoid(alpha, beta) = min(max(alpha x + beta, 0), 1); PaddlePaddle exports alpha 0.2 (its hardsigmoid
# slope), where HSigmoid is alpha 1/6.  Written as its four float16 steps in every target (MindSpore has no
# primitive for it): the device computes those, and a deploy MindIR read back (Muls, Add, Maximum, Minimum)
# computes the same bit for bit.

def _hard_sigmoid_from_mindir(ctx):
    ctx.fail("HardSigmoid with any slope is not a MindSpore primitive (MindSpore writes it as Muls, Add, Maximum, "
             "Minimum)")


def _hard_sigmoid_onnx(node, b):
    a = node.attrs
    y = b.add("Add", [b.add("Mul", [node.inputs[0], b.const(np.float32(a["alpha"]), "alpha")]),
                      b.const(np.float32(a["beta"]), "beta")])
    b.add("Min", [b.add("Max", [y, b.const(np.float32(0.0), "zero")]), b.const(np.float32(1.0), "one")],
          node.outputs[0])


def _hard_sigmoid_ms(node, w):
    a = node.attrs
    return (f"ops.minimum(ops.maximum({w.x(node, 0)} * float({a['alpha']!r}) + float({a['beta']!r}), 0.0), "
            f"1.0)")


register(OpDef("HardSigmoid", _hard_sigmoid_from_mindir, _hard_sigmoid_onnx, to_mindspore=_hard_sigmoid_ms))


# ----------------------------------------------------------------------------- Tanh, Softplus, PReLU

register(OpDef("Tanh", _unary, _simple("Tanh"), exact_in_fp16=False, to_mindspore=_ms("ops.Tanh()")))
register(OpDef("Softplus", _unary, _simple("Softplus"), exact_in_fp16=False, to_mindspore=_ms("ops.Softplus()")))


def _prelu_from_mindir(ctx):
    x = ctx.tensor(0)
    return [x, ctx.tensor(1)], {"rank": len(ctx.shape(x))}


def _prelu_onnx(node, b):
    """MindSpore's PReLU: one slope per channel (axis 1), or one for all; ONNX's slope broadcasts from the right."""
    rank = node.attrs["rank"]
    shape = [-1] + [1] * (rank - 2)
    b.add("PRelu", [node.inputs[0], b.add("Reshape", [node.inputs[1], b.const(np.array(shape, np.int64), "shape")])],
          node.outputs[0])


register(OpDef("PReLU", _prelu_from_mindir, _prelu_onnx,
               to_mindspore=lambda n, w: f"{w.prim('ops.PReLU()')}({w.x(n, 0)}, {w.x(n, 1)})"))
