"""What the per-layer methods (``ranges``, ``adaround``) learn from: for every INT8 op, its input windows as the
device's INT8 network feeds them (one emulation of the deploy graph with every op in INT8, the values before the
op's own Quant), on a seeded sample of output positions (``Context.positions`` per op, spread over the images): a
convolution's im2col'd windows, a MatMul's rows; and the op's float weights and bias.

The methods' target is the op's float output on those same inputs (``float_output``): the error the op's own
quantization adds.  The inputs are those of the network before the method changes any layer (learning each layer
on a fresh emulation of the layers before it would cost one emulation per layer), so a layer does not learn to
undo its upstream's error: where the upstream is changed too, that compensation would be counted twice (measured
on examples/mobilenet_v1_imbalanced: with FP32-network targets the network's output SQNR fell from 37 to 28 dB).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...engine.int8_emulator import Emulator
from ..deploy import quantized_graph
from ..qparams import QuantizedOp, QuantParams

SEED = 0


@dataclass
class LayerData:
    x: np.ndarray        # (P, groups, K per group) float16: the op's input windows, as the INT8 network feeds them
    weight: np.ndarray   # (groups, outputs per group, K per group) float32: the float weights
    bias: np.ndarray     # (groups * outputs per group,) float32: the float bias (zeros where there is none)
    axis: int = 0        # the op's weight channel axis (a MatMul's weight may be (K, N))

    def grouped(self, w: np.ndarray) -> np.ndarray:
        """An op-layout weight (``QuantizedOp.weight``) in this layout (groups, outputs per group, K)."""
        g, og, k = self.weight.shape
        return np.asarray(w).reshape(g, og, k) if w.ndim == 4 else _matmul_rows(w, self.axis).reshape(g, og, k)


def _matmul_rows(w: np.ndarray, axis: int) -> np.ndarray:
    return np.asarray(w) if axis == 0 else np.asarray(w).T


def _windows(x: np.ndarray, attrs: dict, kshape, n, oh, ow) -> np.ndarray:
    """(P, C, kh, kw): the input window of each sampled output position (image ``n``, row ``oh``, column ``ow``)."""
    t, left, b, r = attrs["pads"]
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilations"]
    kh, kw = kshape
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (left, r)))
    span = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
    views = np.lib.stride_tricks.sliding_window_view(xp, span, axis=(2, 3))   # (N, C, rows, cols, *span), no copy
    return views[n, :, oh * sh, ow * sw][:, :, ::dh, ::dw]


def gathered(ctx, qp: QuantParams) -> dict[str, LayerData]:
    """``gather`` for the recovery's ``Context``, kept for the same parameters object: a method undone (the
    parameters before it kept) leaves the next method the inputs it learned from, with no emulation again."""
    if ctx.layer_data is not None and ctx.layer_data[0] is qp:
        return ctx.layer_data[1]
    ctx.layer_data = None   # the last parameters' data freed before this one's is made
    data = gather(ctx.graph, qp, ctx.inputs, ctx.positions)
    ctx.layer_data = (qp, data)
    return data


def gather(graph, qp: QuantParams, inputs: list[np.ndarray], positions: int) -> dict[str, LayerData]:
    """node -> its ``LayerData`` (module doc), for every INT8 op of ``qp`` on the (folded) ``graph``."""
    g = qp.apply(graph)
    nodes = {n.name: n for n in g.nodes}
    ops = qp.ops
    ins = list(dict.fromkeys(q.input for q in ops))
    emu = Emulator(quantized_graph(g, qp), extra_outputs=[t for t in ins if t not in g.inputs])
    rng = np.random.default_rng(SEED)
    per_batch = max(1, -(-positions // max(len(inputs), 1)))
    parts: dict[str, list] = {q.node: [] for q in ops}
    for x in inputs:
        got = emu.outputs(np.asarray(x, np.float16), [t for t in ins if t not in g.inputs])
        got.update({t: np.asarray(x, np.float16).astype(np.float32) for t in ins if t in g.inputs})
        for q in ops:
            node, xin = nodes[q.node], got[q.input]
            if q.op == "Conv2D":
                shape = g.tensors[node.outputs[0]].shape
                n = rng.integers(0, len(xin), per_batch)
                oh, ow = rng.integers(0, shape[2], per_batch), rng.integers(0, shape[3], per_batch)
                w = g.initializers[node.inputs[1]]
                groups = int(node.attrs.get("group", 1))
                win = _windows(xin, node.attrs, w.shape[2:], n, oh, ow).reshape(per_batch, groups, -1)
            else:
                xin2 = xin.reshape(-1, xin.shape[-1])
                win = xin2[rng.integers(0, len(xin2), per_batch)][:, None, :]
            parts[q.node].append(win.astype(np.float16))
    data = {}
    for q in ops:
        node = nodes[q.node]
        w = g.initializers[node.inputs[1]]
        groups = int(node.attrs.get("group", 1)) if q.op == "Conv2D" else 1
        wg = (w.reshape(groups, w.shape[0] // groups, -1) if q.op == "Conv2D"
              else _matmul_rows(w, q.channel_axis)[None])
        bias = g.initializers[node.inputs[2]] if len(node.inputs) == 3 else np.zeros(wg.shape[0] * wg.shape[1])
        d = LayerData(np.concatenate(parts[q.node]), wg.astype(np.float32), np.asarray(bias, np.float32),
                      q.channel_axis)
        data[q.node] = d
    return data


def dequantized(x: np.ndarray, scale_d: float, offset_d: int) -> np.ndarray:
    """AscendQuant then the cube's view of its input: scale_d * (clip(round(x / scale_d) + offset) - offset), in
    float32, as scale_d * clip(round(x / scale_d), -128 - offset, 127 - offset): the same numbers (every
    intermediate is an integer float32 holds exactly, or beyond the clip either way), two passes fewer."""
    s, o = np.float32(scale_d), np.float32(offset_d)
    q = np.asarray(x, np.float32) / s
    np.rint(q, out=q)
    np.minimum(q, np.float32(127) - o, out=q)
    np.maximum(q, np.float32(-128) - o, out=q)
    q *= s
    return q


def _apply(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(P, g, O) = x (P, g, K) times w (g, O, K) per group (batched BLAS)."""
    return np.transpose(np.matmul(np.transpose(x, (1, 0, 2)), np.transpose(w, (0, 2, 1))), (1, 0, 2))


def float_output(d: LayerData) -> np.ndarray:
    """(P, groups, outputs per group): the op's float output (before any ReLU) on its windows, float weights."""
    y = _apply(d.x.astype(np.float32), d.weight)
    g, o = d.weight.shape[:2]
    return y + d.bias.reshape(1, g, o)


def op_output(q: QuantizedOp, d: LayerData, xq: np.ndarray, weight_int=None, bias=None) -> np.ndarray:
    """(P, groups, outputs per group): the op's output from dequantized inputs ``xq``, its int8 weights (or
    ``weight_int``) times scale_w, plus the float ``bias`` (default the float bias)."""
    wq = d.grouped(q.weight if weight_int is None else weight_int).astype(np.float32)
    s = np.asarray(q.scale_w, np.float32).reshape(wq.shape[0], wq.shape[1])
    y = _apply(xq, wq) * s[None]
    b = d.bias if bias is None else bias
    return y + np.asarray(b, np.float32).reshape(1, wq.shape[0], wq.shape[1])
