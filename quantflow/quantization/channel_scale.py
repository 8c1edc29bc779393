"""Per-channel input scales for INT8 convolutions that cross-layer equalization cannot balance: the spread of a
tensor's channel ranges moved into the convolution's weights through a float16 ``Mul`` before its AscendQuant.

AscendQuant has one scale and one offset for the whole tensor, so a tensor whose channels span very different
ranges gives its narrow channels a few of the 256 steps.  Cross-layer equalization (``recovery.equalize``) moves the
spread into the producing convolution's weights, exactly and at no cost, but only through a scale-equivariant
activation (nothing, ReLU, PReLU, a bounded ReLU6); a HardSwish, SiLU, GeLU... in between blocks it.  Here the
convolution's input channel c is multiplied by m_c (a float16 ``Mul`` in front of its AscendQuant) and the weights
reading channel c are divided by m_c: the network computes what it computed (up to the float16 rounding of the
product), and channel c is quantized with step scale_d / m_c.  The scales are cross-layer equalization's
(``equalize.scales``, the same trade-off): for a depthwise convolution, whose per-output-channel weight scales do
not mind, m_c = r_max / r_c brings every channel to the widest one's range (per-channel activation quantization,
as NNCF quantizes depthwise inputs); otherwise m_c ~ sqrt(w_c / r_c) (DFQ's geometric mean of the channel's
activation range r_c and its weight range w_c relative to each output channel's largest weight, SmoothQuant with
alpha 0.5), scaled so that the widest channel keeps the tensor's range.  r_c is max |x| per channel on the
calibration images.  Measured on PP-LCNet page orientation (docs/peers.md).

Which convolutions (``candidates``, ``choose``): every INT8 Conv2D with a constant weight whose input is not scaled
already, that is not the second layer of an ``equalize.find_pairs`` pair (equalization does it without an op), and
whose input's median channel range is below ``MEDIAN_RANGE`` of its widest channel's (the typical channel would
lose more than a bit of the grid).  MatMul / Dense are left as they are.

The scales are within ``equalize.SCALE_LIMIT`` either way, 1 for a channel that is zero on every image, rounded to
float16 (the device's Mul constant is float16); the weights are divided by that float16 value in float64 (stored
float32).

On the device: ``Mul`` (a float16 element-wise op, as every float op between quantized ops) -> AscendQuant ->
the int8 cube -> AscendDequant.  The Mul sits before the Quant, so CANN's Conv2D quant pass still sees
AscendQuant -> Conv2D adjacent and sets the cube's offset_x (``quantization.device_rules``); the cost is one
element-wise op per scaled layer.  A layer the fallback leaves in float16 drops its scales
(``QuantParams.without``) and computes as in the float16-only path, unless the recovery rewrote its float weights on
the scaled graph; elsewhere (``QuantParams.only``, the per-layer analysis) the Mul stays with the divided weights.
"""
from __future__ import annotations

import copy

import numpy as np

from ..ir import Graph, Node, TensorInfo

MEDIAN_RANGE = 0.5       # scale a tensor whose median channel range is below this fraction of its widest
SUFFIX = ":channel_scaled"


def candidates(g: Graph, int8: set[str]) -> list[Node]:
    """The INT8 convolutions of the folded graph ``g`` that may be scaled (module doc)."""
    from .recovery.equalize import find_pairs

    paired = {p.l2.name for p in find_pairs(g, int8)[0]}
    return [n for n in g.nodes if n.name in int8 and n.op == "Conv2D" and n.inputs[1] in g.initializers
            and n.name not in paired and not n.inputs[0].endswith(SUFFIX)]


def scales_for(r: np.ndarray, weight: np.ndarray, group: int) -> np.ndarray | None:
    """The float16 scales (as float32) of a convolution with ``weight`` (O, C / group, kh, kw) reading a tensor
    whose channels' ranges are ``r``, or None where the median channel range is at least ``MEDIAN_RANGE`` of the
    widest (nothing to gain)."""
    from .recovery.equalize import Pair, scales

    r = np.asarray(r, np.float64)
    live = r > 0
    if not live.any() or np.median(r[live]) >= MEDIAN_RANGE * r.max():
        return None
    m = scales(Pair(None, None, None), None, None, np.asarray(weight, np.float64), r, group)
    return m.astype(np.float16).astype(np.float32)


def choose(g: Graph, int8: set[str], batches) -> dict[str, np.ndarray]:
    """node -> its input channel scales, for the ``candidates`` that gain (one float pass over ``batches``)."""
    from .recovery.equalize import channel_ranges

    nodes = candidates(g, int8)
    ranges = channel_ranges(g, list(dict.fromkeys(n.inputs[0] for n in nodes)), batches)
    out = {}
    for n in nodes:
        m = scales_for(ranges[n.inputs[0]], g.initializers[n.inputs[1]], int(n.attrs.get("group", 1)))
        if m is not None:
            out[n.name] = m
    return out


def divisors(m: np.ndarray, weight_shape, group: int) -> np.ndarray:
    """(O, C / group, 1, 1): the scale of the input channel each weight column reads (output o of group o // (O /
    group), column j: channel (o // (O / group)) * (C / group) + j)."""
    o, cpg = weight_shape[:2]
    channel = (np.arange(o) // (o // group))[:, None] * cpg + np.arange(cpg)[None, :]
    return np.asarray(m, np.float64)[channel][:, :, None, None]


def apply(graph: Graph, scales: dict[str, np.ndarray]) -> Graph:
    """``graph`` with, for each node of ``scales``, a ``Mul`` by the scales (1, C, 1, 1) on its input and its
    weights reading input channel c divided by m_c: a new graph (``graph`` itself when ``scales`` is empty or every
    node of it is scaled already, so that applying twice gives the same graph)."""
    todo = {n.name for n in graph.nodes if n.name in scales and not n.inputs[0].endswith(SUFFIX)}
    if not todo:
        return graph
    g = copy.copy(graph)
    g.initializers, g.tensors, g.nodes = dict(graph.initializers), dict(graph.tensors), []
    for node in graph.nodes:
        if node.name not in todo:
            g.nodes.append(node)
            continue
        x, m = node.inputs[0], np.asarray(scales[node.name], np.float32)
        w = graph.initializers[node.inputs[1]]
        n = copy.deepcopy(node)
        names = {k: f"{node.name}{s}" for k, s in (("scale", ":channel_scale"), ("y", SUFFIX),
                                                   ("w", ":channel_scaled_weight"))}
        g.initializers[names["scale"]] = m.reshape(1, -1, 1, 1)
        g.initializers[names["w"]] = (w.astype(np.float64) / divisors(m, w.shape, int(node.attrs.get("group", 1)))
                                      ).astype(np.float32)
        g.tensors[names["y"]] = TensorInfo(graph.shape(x), graph.tensors[x].dtype if x in graph.tensors
                                           else "float32")
        n.inputs = [names["y"], names["w"], *n.inputs[2:]]
        g.nodes += [Node(f"{node.name}:channel_scale", "Mul", [x, names["scale"]], [names["y"]],
                         scope=f"{node.label}/channel_scale"), n]
    g.prune()
    g.check()
    return g
