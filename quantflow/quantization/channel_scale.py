"""Per-channel input scales for depthwise convolutions: per-channel activation quantization on a per-tensor
AscendQuant.

AscendQuant has one scale and one offset for the whole tensor, so a tensor whose channels span very different
ranges gives its narrow channels a few of the 256 steps.  Cross-layer equalization (``recovery.equalize``) moves the
spread into the producing convolution's weights, exactly and at no cost, but only through a scale-equivariant
activation (nothing, ReLU, PReLU, a bounded ReLU6); a HardSwish, SiLU, GeLU... in between blocks it.  A depthwise
convolution's output channel reads one input channel only, so there a float16 ``Mul`` by m_c in front of its
AscendQuant, with the convolution's float weights of the channels reading c divided by m_c, computes what the
network computed (up to the float16 rounding of the product) and quantizes input channel c with step
scale_d / m_c: what a per-channel activation quantizer does (NNCF quantizes depthwise inputs per channel).
Measured on PP-LCNet page orientation (docs/peers.md): output SQNR 23.7 -> 29.8 dB on the held-out images.

Which ops (``candidates``): every INT8 depthwise Conv2D (one input channel per group) whose input is not already
scaled, that cross-layer equalization cannot balance (it is not the second layer of an ``equalize.find_pairs``
pair), and (``choose``) whose input's median channel range (max |x| per channel on the calibration images) is
below ``MEDIAN_RANGE`` of its widest channel's: the typical channel would lose more than a bit of the grid.

The scales: m_c = r_max / r_c (each channel brought to the widest one's range), 1 for a channel that is zero on
every image, at most ``SCALE_LIMIT``, rounded to float16 (the device's Mul constant is float16); the weights are
divided by that float16 value in float64 (stored float32).

On the device: ``Mul`` (a float16 element-wise op, as every float op between quantized ops) -> AscendQuant ->
the int8 depthwise cube -> AscendDequant.  The Mul sits before the Quant, so CANN's Conv2D quant pass still sees
AscendQuant -> Conv2D adjacent and sets the cube's offset_x (``quantization.device_rules``, the facts file); the
cost is one element-wise op per scaled layer.  The Mul stays where its layer is later left in float16 (the
float weights divided by m_c are those of the graph from then on, ``QuantParams.apply``).
"""
from __future__ import annotations

import copy

import numpy as np

from ..ir import Graph, Node, TensorInfo

MEDIAN_RANGE = 0.5       # scale a tensor whose median channel range is below this fraction of its widest
SCALE_LIMIT = 4096.0     # no channel is scaled up more than this (float16 holds it exactly: a power of two)
SUFFIX = ":channel_scaled"


def is_depthwise(g: Graph, n: Node) -> bool:
    if n.op != "Conv2D" or n.inputs[1] not in g.initializers:
        return False
    w = g.initializers[n.inputs[1]]
    return w.shape[1] == 1 and int(n.attrs.get("group", 1)) == g.shape(n.inputs[0])[1] > 1


def candidates(g: Graph, int8: set[str]) -> list[Node]:
    """The INT8 depthwise convolutions of the folded graph ``g`` that may be scaled (module doc)."""
    from .recovery.equalize import find_pairs

    paired = {p.l2.name for p in find_pairs(g, int8)[0]}
    return [n for n in g.nodes if n.name in int8 and is_depthwise(g, n) and n.name not in paired
            and not n.inputs[0].endswith(SUFFIX)]


def scales_for(r: np.ndarray) -> np.ndarray | None:
    """The float16 scales (as float32) for per-channel ranges ``r``, or None where the tensor's median channel
    range is at least ``MEDIAN_RANGE`` of its widest (nothing to gain)."""
    r = np.asarray(r, np.float64)
    live = r > 0
    if not live.any() or np.median(r[live]) >= MEDIAN_RANGE * r.max():
        return None
    m = np.where(live, r.max() / np.where(live, r, 1.0), 1.0)
    return np.clip(m, 1.0, SCALE_LIMIT).astype(np.float16).astype(np.float32)


def choose(g: Graph, int8: set[str], batches) -> dict[str, np.ndarray]:
    """node -> its input channel scales, for the ``candidates`` that gain (one float pass over ``batches``)."""
    from .recovery.equalize import channel_ranges

    nodes = candidates(g, int8)
    ranges = channel_ranges(g, list(dict.fromkeys(n.inputs[0] for n in nodes)), batches)
    out = {}
    for n in nodes:
        m = scales_for(ranges[n.inputs[0]])
        if m is not None:
            out[n.name] = m
    return out


def apply(graph: Graph, scales: dict[str, np.ndarray]) -> Graph:
    """``graph`` with, for each node of ``scales``, a ``Mul`` by the scales (1, C, 1, 1) on its input and its
    weights of the output channels reading input channel c divided by m_c: a new graph (``graph`` itself when
    ``scales`` is empty or every node of it is scaled already, so that applying twice gives the same graph)."""
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
        per_output = np.repeat(m.astype(np.float64), w.shape[0] // len(m))   # output o reads channel o // mult
        n = copy.deepcopy(node)
        names = {k: f"{node.name}{s}" for k, s in (("scale", ":channel_scale"), ("y", SUFFIX),
                                                   ("w", ":channel_scaled_weight"))}
        g.initializers[names["scale"]] = m.reshape(1, -1, 1, 1)
        g.initializers[names["w"]] = (w.astype(np.float64) / per_output.reshape(-1, 1, 1, 1)).astype(np.float32)
        g.tensors[names["y"]] = TensorInfo(graph.shape(x), graph.tensors[x].dtype if x in graph.tensors
                                           else "float32")
        n.inputs = [names["y"], names["w"], *n.inputs[2:]]
        g.nodes += [Node(f"{node.name}:channel_scale", "Mul", [x, names["scale"]], [names["y"]],
                         scope=f"{node.label}/channel_scale"), n]
    g.prune()
    g.check()
    return g
