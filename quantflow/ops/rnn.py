"""Recurrent layers as the device runs them: MindSpore's / CANN's ``DynamicRNN`` (an LSTM) and ``DynamicGRUV2`` (a
GRU), one direction, forward over time, time-major, in float16 (not quantized).

CANN's ONNX parser maps an ONNX LSTM to ``CommonLSTM`` and its ``CommonLSTMFusionPass`` to one DynamicRNN per
direction; an ONNX GRU to ``CommonGRU`` -> ``DynamicGRUV2`` (one per direction) (CANN ``lstm_plugin.cc``,
``gru_plugin.cc``, ``common_lstm_fusion_pass.cc``, ``gru_fusion_pass.cc``).  The plugins read only ``direction``
(and the GRU's ``hidden_size``): activations, ``clip``, ``input_forget`` and the GRU's ``linear_before_reset``
are not passed on, and DynamicGRUV2 always applies the reset gate after the hidden matrix product
(``reset_after`` true = ONNX ``linear_before_reset`` 1, PyTorch's export).  So the IR holds exactly what the
device computes: the ONNX front-end refuses other activations, clipping and ``linear_before_reset`` 0, and
writes a reverse direction as a forward one over the time-reversed sequence.

An IR node carries its weights in ONNX's layout for one forward direction, so that its ONNX lowering (for
onnxruntime, the float16 emulation and deploy.onnx) is the plain ONNX op:

- ``DynamicRNN``: inputs x (T, B, I), W (1, 4H, I), R (1, 4H, H), B (1, 8H), initial h (1, B, H), initial c
  (1, B, H); ONNX's gate order i, o, f, c; the bias is one sum (W's and R's biases added once, as DynamicRNN
  holds one), the second half of B zero.  MindSpore's form: w = [W^T; R^T] (I + H, 4H) and b (4H) in its gate
  order i, j (= c), f, o.
- ``DynamicGRUV2``: inputs x, W (1, 3H, I), R (1, 3H, H), B (1, 6H), initial h (1, B, H); gate order z, r, h;
  MindSpore's form: weight_input W^T, weight_hidden R^T, the two biases, ``gate_order="zrh"``.

Outputs are MindSpore's (8 for DynamicRNN: y, output_h, output_c, i, j, f, o, tanhc; 6 for DynamicGRUV2), each
(T, B, H); a network may use only y (every step's hidden state).  The float16 emulation rounds y once, the
device's kernels compute their gates in float16: not exact (``exact_in_fp16`` False).
"""
from __future__ import annotations

import numpy as np

from .registry import Const, OpDef, register

_LSTM_TO_MS = [0, 3, 2, 1]   # ONNX gate blocks i, o, f, c -> DynamicRNN's i, j (= c), f, o (and back: the same)


def _blocks(a: np.ndarray, order: list[int], axis: int) -> np.ndarray:
    return np.concatenate([np.split(a, len(order), axis=axis)[k] for k in order], axis=axis)


def _sequence_onnx(onnx_op: str, **extra):
    def lower(node, b):
        ins = list(node.inputs[:4]) + [""] + list(node.inputs[4:])
        y = b.add(onnx_op, ins, hidden_size=node.attrs["hidden_size"], **extra)   # Y: (T, 1, B, H)
        b.add("Squeeze", [y, b.const(np.array([1], np.int64), "axes")], node.outputs[0])
    return lower


def _checks(ctx, seq_length: int, attrs: dict) -> None:
    for key, want in attrs.items():
        got = ctx.attr(key, want)
        if (str(got).lower() != str(want).lower()) if isinstance(want, (str, bool)) else float(got) != float(want):
            ctx.fail(f"{key} = {got!r}; quantflow reads {key} = {want!r} only")
    if _given(ctx, seq_length):
        ctx.fail("seq_length is given; quantflow reads full-length sequences only")


def _given(ctx, i: int) -> bool:
    """Input ``i`` is a tensor (not absent, not None)."""
    arg = ctx.args[i] if i < len(ctx.args) else None
    return not (arg is None or isinstance(arg, Const) and arg.value is None)


def _param(ctx, i: int, what: str) -> np.ndarray:
    value = ctx.reader.initializers.get(ctx.tensor(i))
    if value is None:
        ctx.fail(f"input {i} ({what}) is computed at run time; quantflow needs it to be a parameter")
    return value


# ----------------------------------------------------------------------------- DynamicRNN (LSTM)

def _rnn_from_mindir(ctx):
    _checks(ctx, 3, {"cell_type": "LSTM", "direction": "UNIDIRECTIONAL", "cell_depth": 1, "use_peephole": False,
                     "cell_clip": -1.0, "num_proj": 0, "time_major": True, "activation": "tanh", "forget_bias": 0.0})
    ctx.only_output(0)
    x, w, bias = ctx.tensor(0), _param(ctx, 1, "w"), _param(ctx, 2, "b")
    hidden = w.shape[1] // 4
    inp = w.shape[0] - hidden
    onnx_w = _blocks(w, _LSTM_TO_MS, axis=1).T                    # (4H, I + H), rows i, o, f, c
    params = [onnx_w[None, :, :inp], onnx_w[None, :, inp:],
              np.concatenate([_blocks(bias.astype(np.float32), _LSTM_TO_MS, 0), np.zeros(4 * hidden, np.float32)])[None]]
    names = [ctx.reader.add_constant(f"{ctx.node_name}:{k}", np.ascontiguousarray(v, np.float32))
             for k, v in zip("WRB", params)]
    return [x, *names, ctx.tensor(4), ctx.tensor(5)], {"hidden_size": int(hidden)}


def _rnn_ms(node, w):
    W, R, B = (w.array(node, i)[0] for i in (1, 2, 3))
    hidden = node.attrs["hidden_size"]
    weight = _blocks(np.concatenate([W.T, R.T]), _LSTM_TO_MS, axis=1)                      # (I + H, 4H)
    bias = _blocks(B[:4 * hidden].astype(np.float32) + B[4 * hidden:], _LSTM_TO_MS, axis=0)
    prim = w.prim("ops.DynamicRNN(forget_bias=0.0, is_training=False)")
    return (f"{prim}({w.x(node, 0)}, {w.param(weight.astype(np.float16))}, {w.param(bias.astype(np.float16))}, None, "
            f"{w.x(node, 4)}, {w.x(node, 5)})", 8)


register(OpDef("DynamicRNN", _rnn_from_mindir, _sequence_onnx("LSTM"), num_outputs=lambda a: 8, exact_in_fp16=False,
               to_mindspore=_rnn_ms))


# ----------------------------------------------------------------------------- DynamicGRUV2 (GRU)

def _gru_from_mindir(ctx):
    _checks(ctx, 5, {"direction": "UNIDIRECTIONAL", "cell_depth": 1, "cell_clip": -1.0, "num_proj": 0,
                     "time_major": True, "activation": "tanh", "reset_after": True})
    ctx.only_output(0)
    order = {"zrh": [0, 1, 2], "rzh": [1, 0, 2]}.get(str(ctx.attr("gate_order", "rzh")))
    if order is None:
        ctx.fail(f"gate_order {ctx.attr('gate_order')!r}")
    x, wi, wh = ctx.tensor(0), _param(ctx, 1, "weight_input"), _param(ctx, 2, "weight_hidden")
    hidden = wh.shape[0]
    biases = [_param(ctx, i, "bias") if _given(ctx, i) else np.zeros(3 * hidden, np.float32) for i in (3, 4)]
    params = [_blocks(wi, order, 1).T[None], _blocks(wh, order, 1).T[None],
              np.concatenate([_blocks(b.astype(np.float32), order, 0) for b in biases])[None]]
    names = [ctx.reader.add_constant(f"{ctx.node_name}:{k}", np.ascontiguousarray(v, np.float32))
             for k, v in zip("WRB", params)]
    h0 = ctx.reader.add_constant(f"{ctx.node_name}:h0", _param(ctx, 6, "init_h")[None].astype(np.float32))
    return [x, *names, h0], {"hidden_size": int(hidden)}


def _gru_ms(node, w):
    W, R, B = (w.array(node, i)[0] for i in (1, 2, 3))
    hidden = node.attrs["hidden_size"]
    f16 = [np.ascontiguousarray(a, np.float16) for a in (W.T, R.T, B[:3 * hidden], B[3 * hidden:], w.array(node, 4)[0])]
    prim = w.prim("ops.DynamicGRUV2(gate_order='zrh', reset_after=True, is_training=False)")
    return f"{prim}({w.x(node, 0)}, {', '.join(w.param(a) for a in f16[:4])}, None, {w.param(f16[4])})", 6


register(OpDef("DynamicGRUV2", _gru_from_mindir, _sequence_onnx("GRU", linear_before_reset=1),
               num_outputs=lambda a: 6, exact_in_fp16=False, to_mindspore=_gru_ms))
