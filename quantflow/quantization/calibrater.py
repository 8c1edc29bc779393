"""Calibration: observers on the input of every quantized op, then the Ascend INT8 parameters.

``Calibrater`` inserts an observer on each tensor a quantized op (Conv2D, MatMul/Dense with a
constant weight) reads, by exposing those tensors as extra outputs of the IR's float
onnxruntime graph, and runs the calibration batches through it twice: ranges first, then
histograms over those ranges (for the percentile and KL methods).  Ops that read the same
tensor share its observer, hence its scale_d/offset_d.

With ``channel_scale`` the INT8 convolutions whose input channels span very different ranges (and that cross-layer
equalization cannot balance) first get a per-channel float16 scale in front of their AscendQuant (``channel_scale``:
one more float pass), and the calibration runs on that scaled graph; the parameters record the scales
(``QuantParams.channel_scales``).
"""
from __future__ import annotations

from ..engine.runner import float_runner
from ..errors import DataError
from ..ir import Graph, Node
from ..ops import get as get_op
from ..progress import progress
from . import channel_scale as channel_scaling
from . import scheme
from .device_rules import rollback_reason
from .qparams import Float16Op, QuantizedOp, QuantParams
from .ranges import METHODS, Observer
from .selection import first_match


KEPT_BYTES = 256 * 2 ** 20   # the most observed activations the range pass keeps for the histogram pass


def quantizable_nodes(g: Graph) -> list[Node]:
    """The ops the scheme can quantize: registry-quantizable, with a constant weight of a supported layout."""
    out = []
    for n in g.nodes:
        if not get_op(n.op, n.name).quantizable or n.inputs[1] not in g.initializers:
            continue
        if n.op == "MatMul" and (n.attrs["transpose_a"] or n.attrs["rank_a"] != 2 or n.attrs["rank_b"] != 2):
            continue
        out.append(n)
    return out


def in_channels(g: Graph, node: Node) -> int:
    """The channels (Conv2D, NCHW) or features (MatMul) of the tensor a quantizable op's AscendQuant reads."""
    shape = g.shape(node.inputs[0])
    return int(shape[1] if node.op == "Conv2D" else shape[-1])


def precision_plan(g: Graph, skip=(), rollback_small_channels: bool = True) -> tuple[list[Node], list[Float16Op]]:
    """(the ops quantized to INT8, the quantizable ops left in float16 with the reason): those named by a
    ``quantization.skip`` pattern, and (``rollback_small_channels``) those CANN would roll back to float16
    (``device_rules``).  Tests of the INT8 arithmetic on small networks switch the rollback off."""
    int8, float16 = [], []
    for n in quantizable_nodes(g):
        pattern = first_match(n, skip)
        reason = (f"quantization.skip pattern {pattern!r}" if pattern is not None else
                  rollback_reason(n.op, in_channels(g, n)) if rollback_small_channels else None)
        if reason is None:
            int8.append(n)
        else:
            float16.append(Float16Op(n.name, n.label, n.op, n.inputs[0], reason))
    return int8, float16


class Calibrater:
    def __init__(self, graph: Graph, bins: int = 2048, skip=(), rollback_small_channels: bool = True):
        self.graph = graph
        self.nodes, self.float16 = precision_plan(graph, skip, rollback_small_channels)
        self.tensors = list(dict.fromkeys(n.inputs[0] for n in self.nodes))
        self.observers = {t: Observer(t, bins) for t in self.tensors}
        self.runner = float_runner(graph, self.tensors)
        self.images = 0

    def _pass(self, batches, desc: str, kept: list | None = None) -> list | None:
        """One pass of the observers over ``batches``; with ``kept`` (a list) the observed activations of every
        batch are put in it while they fit in ``KEPT_BYTES``: returned, else None."""
        size = 0
        with progress(len(batches) if hasattr(batches, "__len__") else None, desc) as bar:
            for x in batches:
                outs = self.runner.run(x, self.tensors)
                self._observe(outs)
                if kept is not None:
                    size += sum(outs[t].nbytes for t in self.tensors)
                    if size > KEPT_BYTES:
                        kept = None
                    else:
                        kept.append(outs)
                self.images += len(x)
                bar.update(len(x))
        return kept

    def _observe(self, outs: dict) -> None:
        for t in self.tensors:
            try:
                self.observers[t].observe(outs[t])
            except FloatingPointError as err:
                raise DataError(f"calibration: {err}") from None

    def collect(self, batches, histograms: bool = True) -> None:
        """Two passes over ``batches`` (a re-iterable of float N,C,H,W arrays): ranges, then histograms
        over them (the percentile and KL methods need them; minmax does not).  The second pass reads the first
        one's activations where they fit in ``KEPT_BYTES`` (a small network's sample), instead of running the
        network again: the same arrays either way."""
        kept = self._pass(batches, "calibration: ranges", [] if histograms else None)
        if self.images == 0:
            raise DataError("calibration: no calibration images")
        if not histograms:
            return
        for obs in self.observers.values():
            obs.start_histograms()
        if kept is None:
            self._pass(batches, "calibration: histograms")
            return
        for outs in kept:
            self._observe(outs)

    def methods(self, method: str, overrides: dict[str, str] | None = None) -> dict[str, str]:
        """The range method of each observed tensor: that of the first op reading it whose layer an
        ``overrides`` pattern names (``quantization.methods``), else ``method``."""
        out: dict[str, str] = {}
        for n in self.nodes:
            pattern = first_match(n, overrides or {})
            out.setdefault(n.inputs[0], overrides[pattern] if pattern else method)
        return out

    def ranges(self, method: str, percentile: float = 99.99, kl_max_clipped: float = 0.01,
               overrides: dict[str, str] | None = None) -> dict[str, tuple[float, float]]:
        methods = self.methods(method, overrides)
        return {t: obs.range(methods[t], percentile, kl_max_clipped) for t, obs in self.observers.items()}


def _relu_follows(g: Graph, node: Node, consumers) -> bool:
    """AscendDequant's relu_flag: CANN's pass sets it (and deletes the ReLUs) only when every consumer of the
    Dequant is a removable ReLU (v200_not_requant_fusion_pass.cc: ``del_relu_flag = (relu_del && (relu_del ==
    dequant_node->GetOutAllNodes().size()))``; ReLU6 is never fused)."""
    readers = consumers.get(node.outputs[0], [])
    return bool(readers) and all(r.op == "ReLU" for r in readers) and node.outputs[0] not in g.outputs


def quantize(graph: Graph, ranges: dict[str, tuple[float, float]], method: str,
             observers: dict[str, Observer] | None = None, skip=(),
             rollback_small_channels: bool = True) -> QuantParams:
    """The scheme's parameters for every quantized op of ``graph`` (BatchNorm already folded), and the
    quantizable ops left in float16 (``precision_plan``)."""
    consumers = graph.consumers()
    ops = []
    int8, float16 = precision_plan(graph, skip, rollback_small_channels)
    for n in int8:
        lo, hi = ranges[n.inputs[0]]
        scale_d, offset_d = scheme.act_qparams(lo, hi)
        axis = scheme.weight_channel_axis(n.op, n.attrs)
        bias = graph.initializers[n.inputs[2]] if len(n.inputs) == 3 else None
        w_q, scale_w = scheme.quantize_weight(graph.initializers[n.inputs[1]], axis, bias, scale_d)
        stats = {"lo": float(lo), "hi": float(hi)}
        if observers is not None:
            stats.update(observers[n.inputs[0]].summary())
        ops.append(QuantizedOp(
            node=n.name, scope=n.label, op=n.op, input=n.inputs[0], scale_d=scale_d, offset_d=offset_d,
            scale_w=scale_w, channel_axis=axis, weight=w_q,
            bias=scheme.quantize_bias(bias, scale_d, scale_w, n.label),
            deq_scale=scheme.deq_scale(scale_d, scale_w), relu=_relu_follows(graph, n, consumers), stats=stats))
    return QuantParams(method, ops, float16, [n.name for n in quantizable_nodes(graph)])


def calibrate(graph: Graph, batches, method: str, percentile: float = 99.99, bins: int = 2048,
              kl_max_clipped: float = 0.01, skip=(), overrides: dict[str, str] | None = None,
              rollback_small_channels: bool = True, channel_scale: bool = False) -> QuantParams:
    """Observe ``batches`` on the (folded) ``graph`` and compute every quantized op's parameters."""
    return calibrate_with(graph, batches, method, percentile, bins, kl_max_clipped, skip, overrides,
                          rollback_small_channels, channel_scale)[0]


def calibrate_with(graph: Graph, batches, method: str, percentile: float = 99.99, bins: int = 2048,
                   kl_max_clipped: float = 0.01, skip=(), overrides: dict[str, str] | None = None,
                   rollback_small_channels: bool = True, channel_scale: bool = False):
    """``calibrate``, also returning the Calibrater (its observers' histograms feed the report).  With
    ``channel_scale`` the convolutions' inputs are scaled per channel first (module doc): the returned parameters carry
    the scales, the Calibrater observed the scaled graph (``QuantParams.apply(graph)``)."""
    scales = {}
    if channel_scale:
        scales = channel_scaling.choose(graph, {n.name for n in precision_plan(graph, skip, rollback_small_channels)[0]},
                                        batches)
        graph = channel_scaling.apply(graph, scales)
    cal = Calibrater(graph, bins, skip, rollback_small_channels)
    methods = cal.methods(method, overrides)
    cal.collect(batches, histograms=any(METHODS[m].histograms for m in methods.values()))
    qp = quantize(graph, cal.ranges(method, percentile, kl_max_clipped, overrides), method, cal.observers, skip,
                  rollback_small_channels)
    for q in qp.ops:
        q.stats["method"] = methods[q.input]
    qp.channel_scales = scales
    return qp, cal
