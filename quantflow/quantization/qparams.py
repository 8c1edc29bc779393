"""The qparams artifact: every quantizable op's precision on the device and, for the INT8 ones, their Ascend
INT8 parameters.

``qparams.json`` holds one entry per quantizable op, each with its ``device_precision`` ("int8" or "float16")
and the ``reason``.  An INT8 entry (in graph order) has the node name, layer scope, op type, input tensor,
scale_d, offset_d, scale_w[], deq_scale[], fused ReLU, weight shape and channel axis, and ``qparams.npz`` its
int8 weights, int32 biases and float32 deq_scale: everything a deploy graph needs.  A float16 entry (a
convolution CANN would roll back, a layer in ``quantization.skip``, one the automatic fallback rolled back)
names the op and why it stays a float16 op in the emulation and both deploy graphs.

``recovered_float`` (in qparams.json, arrays ``float<i>.weight`` / ``float<i>.bias`` in qparams.npz) names the ops
whose float weights the recovery rewrote in the folded graph (cross-layer equalization,
``quantflow.quantization.recovery``): ``QuantParams.apply`` puts them into the graph, and ``deploy.quantized_graph``
builds every deploy graph (the emulation's, deploy.onnx, the deploy MindIR) from that graph, so that a float16 op
and the float network the INT8 ops were calibrated on are the recovered ones everywhere.

``channel_scaled`` (in qparams.json, arrays ``channel_scale<i>`` in qparams.npz) names the convolutions whose input
the calibration scaled per channel (``quantflow.quantization.channel_scale``): ``QuantParams.apply`` inserts their
float16 ``Mul`` and divides their float weights, before the recovered float weights are put in (those were computed
on the scaled graph).
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..errors import QuantflowError
from ..io.atomic import save_npz, write_json
from . import channel_scale

QPARAMS_JSON, QPARAMS_NPZ = "qparams.json", "qparams.npz"


_CELL = re.compile(r"^(.+?)-[A-Z][A-Za-z0-9_]*$")   # a MindSpore scope step "<attribute>-<CellClass>"
_OP_INDEX = re.compile(r"-op\d+$")                 # the op's index in its cell: "Conv2D-op0"


def short_names(scopes: list[str]) -> dict[str, str]:
    """A short name for each layer scope, unique among ``scopes``, that keeps the block indices: the cell path as
    PyTorch names modules (MindSpore's "features-SequentialCell/1-InvertedResidual/block-SequentialCell/0-..."
    -> "features.1.block.0...", ONNX's "/model.2/cv1/conv/Conv" -> "model.2.cv1.conv"), without the steps every
    layer shares, and the op only where the path alone is not unique (then with its index, or in full)."""
    scopes = list(dict.fromkeys(scopes))
    split = [[p for p in s.split("/") if p] or [s] for s in scopes]
    paths = [[(_CELL.match(p).group(1) if _CELL.match(p) else p) for p in parts[:-1]] for parts in split]
    ops = [parts[-1] for parts in split]
    common = 0
    while (len(scopes) > 1 and all(len(p) > common + 1 for p in paths)
           and len({p[common] for p in paths}) == 1):
        common += 1
    tails = [p[common:] for p in paths]
    for style in (lambda t, op: ".".join(t) or op,
                  lambda t, op: ".".join(t + [_OP_INDEX.sub("", op)]),
                  lambda t, op: ".".join(t + [op])):
        names = [style(t, op) for t, op in zip(tails, ops)]
        if len(set(names)) == len(names):
            return dict(zip(scopes, names))
    return {s: s for s in scopes}


def fit(name: str, width: int) -> str:
    """``name`` in at most ``width`` characters, cut in the middle (both ends say which layer it is)."""
    if len(name) <= width:
        return name
    head = (width - 1) // 2
    return name[:head] + "…" + name[len(name) - (width - 1 - head):]


@dataclass
class QuantizedOp:
    node: str                 # MindIR node name
    scope: str                # readable layer path
    op: str                   # Conv2D | MatMul
    input: str                # the IR tensor AscendQuant reads
    scale_d: float
    offset_d: int
    scale_w: np.ndarray       # float64, per output channel
    channel_axis: int
    weight: np.ndarray        # int8, the op's weight layout
    bias: np.ndarray          # int32, per output channel
    deq_scale: np.ndarray     # float32, per output channel
    relu: bool = False        # ReLU fused into AscendDequant
    stats: dict = field(default_factory=dict)

    def header(self) -> dict:
        return {"node": self.node, "scope": self.scope, "op": self.op, "input": self.input,
                "device_precision": "int8", "reason": INT8_REASON,
                "scale_d": self.scale_d, "offset_d": self.offset_d,
                "scale_w": [float(s) for s in self.scale_w], "deq_scale": [float(s) for s in self.deq_scale],
                "channel_axis": self.channel_axis, "weight_shape": list(self.weight.shape),
                "relu": self.relu, "stats": self.stats}


INT8_REASON = "quantized: AscendQuant -> int8 cube -> AscendDequant"


@dataclass
class Float16Op:
    """A quantizable op left in float16 on the device, and why."""
    node: str
    scope: str
    op: str
    input: str
    reason: str

    def header(self) -> dict:
        return {"node": self.node, "scope": self.scope, "op": self.op, "input": self.input,
                "device_precision": "float16", "reason": self.reason}


@dataclass
class QuantParams:
    method: str
    ops: list[QuantizedOp]                                    # INT8 on the device, in graph order
    float16: list[Float16Op] = field(default_factory=list)    # quantizable, left in float16
    order: list[str] = field(default_factory=list)            # every quantizable op's node, in graph order
    # node -> {"weight": float32, "bias": float32}: the folded graph's float weights the recovery rewrote
    float_weights: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    # node -> float16-valued float32 per input channel: a convolution's input scales (``channel_scale``)
    channel_scales: dict[str, np.ndarray] = field(default_factory=dict)

    def without(self, nodes, reason: str) -> "QuantParams":
        """These parameters with the INT8 ops of ``nodes`` left in float16 for ``reason``.  Such a layer drops its
        input channel scales too (``channel_scale``: there for INT8's one step per tensor, in float16 a Mul and
        divided weights that only add rounding), so that it computes as in the float16-only path; not where the
        recovery rewrote its float weights, which were computed on the scaled graph."""
        drop = set(nodes)
        return replace(self, ops=[q for q in self.ops if q.node not in drop],
                       float16=self.float16 + [Float16Op(q.node, q.scope, q.op, q.input, reason)
                                               for q in self.ops if q.node in drop],
                       channel_scales={k: v for k, v in self.channel_scales.items()
                                       if k not in drop or k in self.float_weights})

    def only(self, nodes) -> "QuantParams":
        """These parameters with only the INT8 ops of ``nodes`` (the others as in the float graph), keeping the
        recovered float weights."""
        keep = set(nodes)
        return replace(self, ops=[q for q in self.ops if q.node in keep], float16=[])

    def apply(self, graph):
        """The (BatchNorm-folded) ``graph`` with the convolutions' input scales (``channel_scales``: a Mul inserted,
        the weights divided, ``channel_scale.apply``) and then the recovered float weights (``float_weights``,
        which were computed on the scaled graph) in place: a new graph; ``graph`` itself when there are none.
        Applying twice gives the same graph."""
        graph = channel_scale.apply(graph, self.channel_scales)
        if not self.float_weights:
            return graph
        g = copy.copy(graph)
        g.initializers, g.nodes = dict(graph.initializers), list(graph.nodes)
        index = {n.name: i for i, n in enumerate(g.nodes)}
        missing = [n for n in self.float_weights if n not in index]
        if missing:
            raise QuantflowError(f"recovered float weights name node(s) not in the graph: {', '.join(missing)}")
        for node, arrays in self.float_weights.items():
            n = copy.deepcopy(g.nodes[index[node]])
            for slot, key in ((1, "weight"), (2, "bias")):
                if key not in arrays:
                    continue
                name = f"{node}:recovered_{key}"
                g.initializers[name] = np.asarray(arrays[key], np.float32)
                if slot < len(n.inputs):
                    n.inputs[slot] = name
                else:
                    n.inputs.append(name)
            g.nodes[index[node]] = n
        return g

    def entries(self) -> list[dict]:
        """qparams.json's entries: every quantizable op, in graph order (INT8 ops first where it is not known)."""
        headers = {q.node: q.header() for q in [*self.ops, *self.float16]}
        return [headers[n] for n in self.order if n in headers] + [h for n, h in headers.items() if n not in self.order]

    def by_node(self) -> dict[str, QuantizedOp]:
        return {q.node: q for q in self.ops}

    def save(self, out_dir: Path) -> tuple[Path, Path]:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        js, npz = out_dir / QPARAMS_JSON, out_dir / QPARAMS_NPZ
        entries, by_node = self.entries(), self.by_node()
        arrays = {}  # numbered as the INT8 entries come in qparams.json
        for i, q in enumerate(by_node[e["node"]] for e in entries if e["device_precision"] == "int8"):
            arrays[f"{i}.weight"], arrays[f"{i}.bias"], arrays[f"{i}.deq_scale"] = q.weight, q.bias, q.deq_scale
        recovered = []
        for i, (node, fw) in enumerate(self.float_weights.items()):
            recovered.append({"node": node, "arrays": sorted(fw)})
            arrays.update({f"float{i}.{k}": v for k, v in fw.items()})
        scaled = list(self.channel_scales)
        arrays.update({f"channel_scale{i}": self.channel_scales[node] for i, node in enumerate(scaled)})
        save_npz(npz, arrays)  # the arrays first: a reader finding the json finds its arrays
        meta = {"scheme": "ascend-int8", "method": self.method, "ops": entries}
        if recovered:
            meta["recovered_float"] = recovered
        if scaled:
            meta["channel_scaled"] = scaled
        write_json(js, meta, indent=1, sort_keys=False)
        return js, npz

    @classmethod
    def load(cls, out_dir: Path) -> "QuantParams":
        js, npz = Path(out_dir) / QPARAMS_JSON, Path(out_dir) / QPARAMS_NPZ
        try:
            meta = json.loads(js.read_text())
            arrays = np.load(npz)
        except (OSError, ValueError) as err:
            raise QuantflowError(f"cannot read quantization parameters from {out_dir}: {err}") from None
        ops, float16, order = [], [], []
        for h in meta["ops"]:
            order.append(h["node"])
            if h.get("device_precision", "int8") == "float16":
                float16.append(Float16Op(h["node"], h["scope"], h["op"], h["input"], h["reason"]))
                continue
            i = len(ops)
            ops.append(QuantizedOp(
                node=h["node"], scope=h["scope"], op=h["op"], input=h["input"], scale_d=h["scale_d"],
                offset_d=h["offset_d"], scale_w=np.asarray(h["scale_w"], np.float64),
                channel_axis=h["channel_axis"], weight=arrays[f"{i}.weight"], bias=arrays[f"{i}.bias"],
                deq_scale=arrays[f"{i}.deq_scale"], relu=h["relu"], stats=h.get("stats", {})))
        float_weights = {r["node"]: {k: arrays[f"float{i}.{k}"] for k in r["arrays"]}
                         for i, r in enumerate(meta.get("recovered_float", []))}
        channel_scales = {node: arrays[f"channel_scale{i}"] for i, node in enumerate(meta.get("channel_scaled", []))}
        return cls(meta["method"], ops, float16, order, float_weights, channel_scales)

    def table(self) -> str:
        """One line per op: its short name (``short_names``), its parameters, and its full layer scope last."""
        short = short_names([q.scope for q in self.ops])
        width = min(40, max([len(n) for n in short.values()] + [5]))
        rows = [f"{'layer':<{width}} {'op':<7} {'scale_d':>10} {'offset_d':>8} {'range lo':>10} {'range hi':>10} "
                f"{'scale_w min..max':>22}  full layer name"]
        for q in self.ops:
            lo, hi = q.stats.get("lo", float("nan")), q.stats.get("hi", float("nan"))
            rows.append(f"{fit(short[q.scope], width):<{width}} {q.op:<7} {q.scale_d:>10.5g} {q.offset_d:>8d} "
                        f"{lo:>10.4f} {hi:>10.4f} {q.scale_w.min():>10.3g}..{q.scale_w.max():<10.3g}  {q.scope}")
        return "\n".join(rows)

    def float16_table(self) -> str:
        """The quantizable ops left in float16 on the device, each with its reason."""
        return "\n".join(f"  {f.scope}  ({f.op}): {f.reason}" for f in self.float16)
