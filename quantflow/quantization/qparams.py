"""The qparams artifact: every quantized op's Ascend INT8 parameters.

``qparams.json`` (one entry per quantized op, in graph order: MindIR node name, layer scope,
op type, input tensor, scale_d, offset_d, scale_w[], deq_scale[], fused ReLU, weight shape and
channel axis) and ``qparams.npz`` (int8 weights, int32 biases, float32 deq_scale per op):
everything a deploy graph needs.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import QuantflowError
from ..io.atomic import save_npz, write_json

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
                "scale_d": self.scale_d, "offset_d": self.offset_d,
                "scale_w": [float(s) for s in self.scale_w], "deq_scale": [float(s) for s in self.deq_scale],
                "channel_axis": self.channel_axis, "weight_shape": list(self.weight.shape),
                "relu": self.relu, "stats": self.stats}


@dataclass
class QuantParams:
    method: str
    ops: list[QuantizedOp]

    def by_node(self) -> dict[str, QuantizedOp]:
        return {q.node: q for q in self.ops}

    def save(self, out_dir: Path) -> tuple[Path, Path]:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        js, npz = out_dir / QPARAMS_JSON, out_dir / QPARAMS_NPZ
        arrays = {}
        for i, q in enumerate(self.ops):
            arrays[f"{i}.weight"], arrays[f"{i}.bias"], arrays[f"{i}.deq_scale"] = q.weight, q.bias, q.deq_scale
        save_npz(npz, arrays)  # the arrays first: a reader finding the json finds its arrays
        write_json(js, {"scheme": "ascend-int8", "method": self.method, "ops": [q.header() for q in self.ops]},
                   indent=1, sort_keys=False)
        return js, npz

    @classmethod
    def load(cls, out_dir: Path) -> "QuantParams":
        js, npz = Path(out_dir) / QPARAMS_JSON, Path(out_dir) / QPARAMS_NPZ
        try:
            meta = json.loads(js.read_text())
            arrays = np.load(npz)
        except (OSError, ValueError) as err:
            raise QuantflowError(f"cannot read quantization parameters from {out_dir}: {err}") from None
        ops = []
        for i, h in enumerate(meta["ops"]):
            ops.append(QuantizedOp(
                node=h["node"], scope=h["scope"], op=h["op"], input=h["input"], scale_d=h["scale_d"],
                offset_d=h["offset_d"], scale_w=np.asarray(h["scale_w"], np.float64),
                channel_axis=h["channel_axis"], weight=arrays[f"{i}.weight"], bias=arrays[f"{i}.bias"],
                deq_scale=arrays[f"{i}.deq_scale"], relu=h["relu"], stats=h.get("stats", {})))
        return cls(meta["method"], ops)

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
