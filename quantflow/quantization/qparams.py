"""The qparams artifact: every quantized op's Ascend INT8 parameters.

``qparams.json`` (one entry per quantized op, in graph order: MindIR node name, layer scope,
op type, input tensor, scale_d, offset_d, scale_w[], deq_scale[], fused ReLU, weight shape and
channel axis) and ``qparams.npz`` (int8 weights, int32 biases, float32 deq_scale per op):
everything a deploy graph needs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import QuantflowError
from ..io.atomic import save_npz, write_json

QPARAMS_JSON, QPARAMS_NPZ = "qparams.json", "qparams.npz"


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
        rows = [f"{'layer':<48} {'op':<7} {'scale_d':>10} {'offset_d':>8} {'range lo':>10} {'range hi':>10} "
                f"{'scale_w min..max':>22}"]
        for q in self.ops:
            lo, hi = q.stats.get("lo", float("nan")), q.stats.get("hi", float("nan"))
            layer = q.scope.removeprefix("Default/")
            rows.append(f"{layer[-48:]:<48} {q.op:<7} {q.scale_d:>10.5g} {q.offset_d:>8d} {lo:>10.4f} {hi:>10.4f} "
                        f"{q.scale_w.min():>10.3g}..{q.scale_w.max():<10.3g}")
        return "\n".join(rows)
