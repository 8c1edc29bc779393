"""Cross-layer equalization (Nagel et al., "Data-Free Quantization Through Weight Equalization and Bias
Correction", ICCV 2019, sec. 4.1), exact on the float network.

A pair is two convolutions ``L1 -> act -> L2`` on the BatchNorm-folded graph, where ``act`` is nothing, a ReLU or a
PReLU (positively homogeneous: f(s y) = s f(y) for s > 0, a PReLU's slopes unchanged), the tensors between are
read by nothing else, and ``L2`` is INT8.  Output channel c of ``L1`` (weights and bias) is multiplied by s_c and
the input channel c of ``L2`` divided by it: the network computes what it computed, up to float rounding.

The scales: the device quantizes the tensor between with one scale (per tensor) and ``L2``'s weights with one
scale per output channel, while ``L1``'s per-output-channel weights do not mind the rescaling.  So s_c brings the
per-channel range r1_c of the tensor between (max |x| on the calibration images) and the range r2_c of ``L2``'s
input channel c (relative to each output channel's own largest weight) to their geometric mean:
s_c ~ sqrt(r2_c / r1_c) (DFQ's rule with the activation range for ``L1``'s weight range); where ``L2`` is a
depthwise convolution its weights do not mind either, and s_c ~ 1 / r1_c equalizes the tensor.

A ReLU6 is not scale-equivariant (it clips at 6), nor are SiLU, HardSwish, GeLU, Sigmoid...: such a pair is left
alone (the record says so), with one exact exception for ReLU6.  Where ``L1`` reads a ReLU6 output (its input is in
[0, 6]), the bound u_c = b_c + 6 sum(max(w_c, 0)) holds for every input; a channel with u_c <= 6 is never clipped,
so ReLU6 is ReLU on it, and stays so for any s_c <= 6 / u_c.  The other channels keep s_c = 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...engine.runner import float_runner
from ...ir import Graph, Node

EQUIVARIANT = ("ReLU", "PReLU")            # f(s y) = s f(y) for every s > 0
NOT_EQUIVARIANT = ("ReLU6", "SiLU", "HSwish", "HSigmoid", "GeLU", "Sigmoid", "Tanh", "Softplus", "HardSigmoid")
RELU6_MAX = 6.0
SCALE_LIMIT = 4096.0                       # no channel is rescaled more than this either way
# "auto" equalizes only a tensor whose median channel range is below this fraction of its widest channel's (that
# median channel gets fewer than 3 of the 8 bits): cheap to find (one float pass), and it spares the calibration
# again and the measurements a network whose channels already share one scale well
AUTO_MEDIAN_RANGE = 1.0 / 32
MIN_SPREAD = 1.05                          # a pair whose scales are all within 5% of each other is left as it is


@dataclass
class Pair:
    l1: Node
    act: Node | None
    l2: Node
    bounded: bool = False                  # act is a ReLU6 and L1's input is in [0, 6]

    @property
    def tensor(self) -> str:               # what L2 reads: the tensor the device quantizes per tensor
        return self.l2.inputs[0]

    def describe(self) -> str:
        return f"{self.l1.label} -> {self.act.op if self.act else 'identity'} -> {self.l2.label}"


def _const_conv(g: Graph, n: Node | None) -> bool:
    return (n is not None and n.op == "Conv2D" and n.inputs[1] in g.initializers
            and all(i in g.initializers for i in n.inputs[2:]))


def _in_relu6_range(g: Graph, tensor: str, producer) -> bool:
    """Is ``tensor`` a ReLU6 output (through max pooling, which keeps the interval)."""
    p = producer.get(tensor)
    while p is not None and p.op == "MaxPool":
        p = producer.get(p.inputs[0])
    return p is not None and p.op == "ReLU6"


def find_pairs(g: Graph, int8: set[str], also: tuple[str, ...] = ()) -> tuple[list[Pair], list[dict]]:
    """(the pairs that can be equalized, the chains left alone with the reason), for the INT8 ``L2``s; ``also``:
    activations between taken as they are (for a rescaling that need not be exact: the retraining's)."""
    producer, consumers = g.producer(), g.consumers()

    def only_reader(tensor: str, node: Node) -> bool:
        return tensor not in g.outputs and [r.name for r in consumers.get(tensor, [])] == [node.name]

    pairs, alone = [], []
    for l2 in g.nodes:
        if l2.name not in int8 or not _const_conv(g, l2):
            continue
        x = l2.inputs[0]
        p = producer.get(x)
        if p is None or not only_reader(x, l2):
            continue
        act, l1 = (p, producer.get(p.inputs[0])) if p.op in EQUIVARIANT + NOT_EQUIVARIANT else (None, p)
        if not _const_conv(g, l1) or (act is not None and not only_reader(act.inputs[0], act)):
            continue
        if g.initializers[l1.inputs[1]].shape[0] != g.shape(x)[1]:
            continue
        pair = Pair(l1, act, l2)
        if act is not None and act.op == "ReLU6" and _in_relu6_range(g, l1.inputs[0], producer):
            pair.bounded = True
        elif act is not None and act.op in NOT_EQUIVARIANT and act.op not in also:
            alone.append({"pair": pair.describe(), "l2": l2.name,
                          "reason": f"{act.op} between is not scale-equivariant"
                                    + (" and the input of the first layer is not bounded" if act.op == "ReLU6" else "")})
            continue
        pairs.append(pair)
    return pairs, alone


def channel_ranges(g: Graph, tensors: list[str], inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """tensor -> per-channel max |x| (axis 1) over ``inputs``."""
    if not tensors:
        return {}
    run = float_runner(g, tensors)
    out: dict[str, np.ndarray] = {}
    for x in inputs:
        for t, v in run.run(x, tensors).items():
            m = np.abs(v).max(axis=tuple(i for i in range(v.ndim) if i != 1))
            out[t] = m if t not in out else np.maximum(out[t], m)
    return out


def scales(pair: Pair, w1: np.ndarray, b1: np.ndarray | None, w2: np.ndarray, r1: np.ndarray,
           group2: int) -> np.ndarray:
    """The per-channel scales s of ``pair`` (module doc), 1 where a channel must keep its scale."""
    r1 = np.asarray(r1, np.float64)
    c = len(r1)
    cpg = w2.shape[1]
    if cpg == 1:   # depthwise L2: its per-channel weights do not mind
        ideal = 1.0 / np.maximum(r1, 1e-30)
    else:
        a = np.abs(w2).reshape(w2.shape[0], cpg, -1).max(axis=2).astype(np.float64)
        a /= np.maximum(a.max(axis=1, keepdims=True), 1e-30)
        r2 = a.reshape(group2, -1, cpg).max(axis=1).reshape(c)
        ideal = np.sqrt(r2 / np.maximum(r1, 1e-30))
    live = (r1 > 0) & np.isfinite(ideal) & (ideal > 0)
    cap = np.full(c, np.inf)
    allowed = np.ones(c, bool)
    if pair.bounded:
        bias = np.zeros(c) if b1 is None else np.asarray(b1, np.float64)
        u = bias + RELU6_MAX * np.maximum(w1.astype(np.float64), 0).reshape(c, -1).sum(axis=1)
        allowed = u <= RELU6_MAX
        cap = np.where(u > 0, RELU6_MAX / np.maximum(u, 1e-30), np.inf)
    fixed = ~(allowed & live)
    if not live.any():
        return np.ones(c)
    if (fixed & live).any():   # the channels that keep their scale set the level
        level = 1.0 / float(np.exp(np.median(np.log(ideal[fixed & live]))))
    else:                      # the widest channel of the tensor keeps its range
        level = float(r1.max() / (r1 * np.where(live, ideal, 0)).max())
    s = np.clip(level * np.where(live, ideal, 1.0), 1.0 / SCALE_LIMIT, SCALE_LIMIT)
    s = np.minimum(s, cap)
    s[fixed] = 1.0
    return s


def median_range(r: np.ndarray) -> float:
    """A tensor's median channel range over its widest (the live channels'; 1.0 when none is live): how much of
    the per-tensor INT8 grid its typical channel gets."""
    live = r > 0
    return float(np.median(r[live]) / r.max()) if live.any() else 1.0


def equalize(g: Graph, int8: set[str], inputs: list[np.ndarray],
             only_starved: bool = False) -> tuple[dict, list[dict], list[dict]]:
    """(node -> {"weight", "bias"}: the rescaled float weights, one record per equalized pair, the chains left
    alone) for the folded graph ``g`` (with any earlier recovered weights in place).  ``only_starved`` ("auto"):
    only the pairs whose tensor's median channel range is below ``AUTO_MEDIAN_RANGE`` of its widest."""
    pairs, alone = find_pairs(g, int8)
    tensors = list(dict.fromkeys(p.tensor for p in pairs))
    if only_starved and len(inputs) > 1 and tensors:
        # a first look on one batch: a tensor far from starved there (twice the limit) is not worth a pass over
        # every image, so a build with nothing to equalize costs one batch's float run
        first = channel_ranges(g, tensors, inputs[:1])
        tensors = [t for t in tensors if median_range(first[t]) < 2 * AUTO_MEDIAN_RANGE]
    ranges = channel_ranges(g, tensors, inputs)
    weights: dict[str, dict[str, np.ndarray]] = {}

    def current(n: Node) -> dict[str, np.ndarray]:
        if n.name not in weights:
            weights[n.name] = {"weight": g.initializers[n.inputs[1]].astype(np.float64)}
            if len(n.inputs) == 3:
                weights[n.name]["bias"] = g.initializers[n.inputs[2]].astype(np.float64)
        return weights[n.name]

    done = []
    for p in pairs:
        if p.tensor not in ranges:
            alone.append({"pair": p.describe(), "l2": p.l2.name, "reason": "already balanced"})
            continue
        one, two = current(p.l1), current(p.l2)
        group2 = int(p.l2.attrs.get("group", 1))
        s = scales(p, one["weight"], one.get("bias"), two["weight"], ranges[p.tensor], group2)
        r1 = ranges[p.tensor]
        live = r1 > 0
        median = median_range(r1)
        if only_starved and median >= AUTO_MEDIAN_RANGE:
            alone.append({"pair": p.describe(), "l2": p.l2.name, "reason": "already balanced",
                          "median_channel_range": median})
            continue
        if s.max() / s.min() < MIN_SPREAD:
            alone.append({"pair": p.describe(), "l2": p.l2.name, "reason": "already balanced"})
            continue
        one["weight"] = one["weight"] * s.reshape(-1, 1, 1, 1)
        if "bias" in one:
            one["bias"] = one["bias"] * s
        cpg, cout2 = two["weight"].shape[1], two["weight"].shape[0]
        per = s.reshape(group2, cpg)[np.arange(cout2) // (cout2 // group2)]   # (Cout2, cpg): the scale of each column
        two["weight"] = two["weight"] / per[:, :, None, None]
        done.append({"pair": p.describe(), "l1": p.l1.name, "l2": p.l2.name,
                     "activation": p.act.op if p.act else "identity",
                     "scale_min": float(s.min()), "scale_max": float(s.max()),
                     "range_spread_before": float(r1.max() / r1[live].min()) if live.any() else 1.0,
                     "range_spread_after": float((r1 * s).max() / (r1 * s)[live].min()) if live.any() else 1.0,
                     "channels_fixed": int((s == 1.0).sum())})
    changed = {d["l1"] for d in done} | {d["l2"] for d in done}
    return ({n: {k: v.astype(np.float32) for k, v in w.items()} for n, w in weights.items() if n in changed},
            done, alone)
