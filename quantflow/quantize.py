"""INT8 quantization parameters: BN folding, per-channel weights, activation scales, requantization.

Scheme (what the integer emulator executes, bit for bit):

* activations: per-tensor asymmetric int8, ``real = scale * (q - zero_point)``, q in [-128, 127];
  the range comes from the calibration observers (min-max, percentile or KL);
* weights: per-output-channel symmetric int8 in [-127, 127] after folding BatchNorm into the
  preceding convolution;
* bias: int32, ``round(b / (s_in * s_w[c]))``;
* a Conv2d/Dense block (with its folded BN and fused ReLU/ReLU6) accumulates
  ``sum(w_q * (x_q - zp_in)) + b_q`` in int32 and requantizes to the next int8 tensor with a
  fixed-point multiplier ``m0 * 2**-shift`` (m0 a 31-bit integer), rounding half up;
* the last block dequantizes its int32 accumulator to float logits.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from .errors import UnsupportedNetworkError
from .graph import BatchNormOp, ConvOp, DenseOp, FlattenOp, IdentityOp, Op, Plan, PoolOp, ReluOp

QMIN, QMAX = -128, 127
WMAX = 127
FORMAT_VERSION = 1


# ----------------------------------------------------------------------------- blocks

@dataclass
class Block:
    """A Conv2d/Dense with the BatchNorm folded into it and the ReLU fused after it."""
    layer: ConvOp | DenseOp
    bn: Optional[BatchNormOp] = None
    relu: Optional[ReluOp] = None

    @property
    def name(self) -> str:
        return self.layer.name

    @property
    def out_name(self) -> str:
        """The op whose output is the block's (requantized) output."""
        return (self.relu or self.bn or self.layer).name

    @property
    def out_observer(self) -> str:
        """Name of the observer whose range sets the block's output scale."""
        return self.out_name if self.out_name != self.name else f"{self.name}:out"

    def folded(self) -> tuple[np.ndarray, np.ndarray]:
        w = self.layer.weight.astype(np.float64)
        o = w.shape[0]
        b = self.layer.bias.astype(np.float64) if self.layer.bias is not None else np.zeros(o)
        if self.bn is not None:
            if len(self.bn.scale) != o:
                raise UnsupportedNetworkError(f"{self.bn.name}: {len(self.bn.scale)} channels after {o}-channel {self.name}")
            w = w * self.bn.scale.reshape((o,) + (1,) * (w.ndim - 1))
            b = b * self.bn.scale + self.bn.shift
        return w, b


def build_blocks(plan: Plan) -> list[Block | Op]:
    """Group the plan into quantized blocks and the int8 pass-through ops between them."""
    items: list[Block | Op] = []
    for op in plan.ops:
        last = items[-1] if items else None
        if isinstance(op, (ConvOp, DenseOp)):
            items.append(Block(op))
        elif isinstance(op, BatchNormOp):
            if isinstance(last, Block) and isinstance(last.layer, ConvOp) and last.bn is None and last.relu is None:
                last.bn = op
            else:
                raise UnsupportedNetworkError(
                    f"{op.name}: a BatchNorm2d is supported only directly after a Conv2d (it is folded into it)")
        elif isinstance(op, ReluOp) and isinstance(last, Block) and last.relu is None:
            last.relu = op
        elif isinstance(op, (ReluOp, PoolOp, FlattenOp, IdentityOp)):
            items.append(op)
        else:  # pragma: no cover - read_plan only makes the kinds above
            raise UnsupportedNetworkError(f"{op.name}: {op.kind} cannot be quantized")
    return items


# ----------------------------------------------------------------------------- arithmetic

def act_qparams(lo: float, hi: float) -> tuple[float, int]:
    """Scale and zero point of an asymmetric int8 tensor covering [lo, hi] (and 0)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if hi - lo < 1e-8:
        hi = lo + 1e-8
    scale = (hi - lo) / (QMAX - QMIN)
    zp = int(np.clip(np.round(QMIN - lo / scale), QMIN, QMAX))
    return scale, zp


def quantize_tensor(x: np.ndarray, scale: float, zp: int) -> np.ndarray:
    """float -> int8, rounding half up (floor(x/s + 0.5)), saturating."""
    q = np.floor(np.asarray(x, np.float64) / scale + 0.5) + zp
    return np.clip(q, QMIN, QMAX).astype(np.int8)


def dequantize_tensor(q: np.ndarray, scale: float, zp: int) -> np.ndarray:
    return (q.astype(np.float64) - zp) * scale


def weight_qparams(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-output-channel symmetric int8 weights: (w_q int8, scale per channel)."""
    flat = np.abs(w.reshape(w.shape[0], -1)).max(axis=1)
    scale = np.where(flat > 0, flat / WMAX, 1.0)
    wq = np.clip(np.round(w / scale.reshape((-1,) + (1,) * (w.ndim - 1))), -WMAX, WMAX).astype(np.int8)
    return wq, scale


def quantize_multiplier(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Real multipliers (0 < m < 2**30) as (m0, shift): m ~= m0 * 2**-shift, 2**30 <= m0 < 2**31."""
    m = np.asarray(m, np.float64)
    if np.any(m <= 0) or np.any(~np.isfinite(m)):
        raise ValueError(f"requantization multipliers must be positive and finite, got {m}")
    mant, exp = np.frexp(m)
    m0 = np.round(mant * (1 << 31)).astype(np.int64)
    carry = m0 == (1 << 31)
    m0[carry] //= 2
    exp = exp + carry
    shift = 31 - exp.astype(np.int64)
    if np.any(shift < 1):
        raise UnsupportedNetworkError(f"requantization multiplier too large ({m.max():.3g}): activation ranges collapse")
    over = shift > 62
    m0[over] >>= (shift[over] - 62)
    shift[over] = 62
    return m0, shift


def requantize(acc: np.ndarray, m0: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """int32 accumulators * (m0 * 2**-shift), rounded half up, in int64 arithmetic (channel axis 1)."""
    shape = (1, -1) + (1,) * (acc.ndim - 2)
    m0 = m0.reshape(shape)
    shift = shift.reshape(shape)
    return (acc.astype(np.int64) * m0 + (np.int64(1) << (shift - 1))) >> shift


# ----------------------------------------------------------------------------- the quantized model

@dataclass
class QLayer:
    name: str
    kind: str                       # "conv" | "dense"
    w_q: np.ndarray                 # int8
    w_scale: np.ndarray             # float64, per output channel
    b_q: np.ndarray                 # int32
    in_scale: float
    in_zp: int
    final: bool                     # dequantize to float instead of requantizing
    out_scale: float = 0.0
    out_zp: int = 0
    m0: Optional[np.ndarray] = None     # int64 per channel
    shift: Optional[np.ndarray] = None  # int64 per channel
    clamp_lo: int = QMIN
    clamp_hi: int = QMAX
    relu_cap: Optional[float] = None    # float ReLU on the final (dequantized) output
    relu: bool = False
    conv: Optional[dict] = None     # stride, dilation, pad_mode, padding, group


@dataclass
class QStep:
    """An int8 pass-through op between layers (pooling, flatten, ReLU, identity)."""
    name: str
    kind: str
    attrs: dict = field(default_factory=dict)


@dataclass
class QuantModel:
    input_shape: tuple
    input_scale: float
    input_zp: int
    steps: list                     # QLayer | QStep, in order
    method: str
    ranges: dict                    # observer name -> {"min","max","lo","hi"} report

    # ---------------------------------------------------------------- persistence
    def save(self, json_path: Path, npz_path: Path) -> None:
        arrays, steps = {}, []
        for i, s in enumerate(self.steps):
            if isinstance(s, QLayer):
                d = {k: v for k, v in asdict(s).items() if not isinstance(v, np.ndarray)}
                for key in ("w_q", "w_scale", "b_q", "m0", "shift"):
                    v = getattr(s, key)
                    if v is not None:
                        arrays[f"{i}.{key}"] = v
                        d[key] = f"{i}.{key}"
                d["type"] = "layer"
            else:
                d = {"type": "step", **asdict(s)}
            steps.append(d)
        meta = {"format": FORMAT_VERSION, "input_shape": list(self.input_shape), "input_scale": self.input_scale,
                "input_zp": self.input_zp, "method": self.method, "ranges": self.ranges, "steps": steps}
        Path(json_path).write_text(json.dumps(meta, indent=1, default=_jsonable) + "\n")
        with open(npz_path, "wb") as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, json_path: Path, npz_path: Path) -> "QuantModel":
        meta = json.loads(Path(json_path).read_text())
        if meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"{json_path}: unknown quantization-parameter format {meta.get('format')!r}")
        with np.load(npz_path) as z:
            arrays = {k: z[k] for k in z.files}
        steps = []
        for d in meta["steps"]:
            d = dict(d)
            kind = d.pop("type")
            if kind == "layer":
                for key in ("w_q", "w_scale", "b_q", "m0", "shift"):
                    if d.get(key) is not None:
                        d[key] = arrays[d[key]]
                steps.append(QLayer(**d))
            else:
                steps.append(QStep(**d))
        return cls(tuple(meta["input_shape"]), meta["input_scale"], meta["input_zp"], steps, meta["method"],
                   meta["ranges"])


def _jsonable(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, tuple):
        return list(v)
    raise TypeError(f"not JSON serializable: {type(v)}")


def make_quant_model(items: list, input_shape, ranges: dict[str, tuple[float, float]], method: str,
                     report: dict) -> QuantModel:
    """Turn blocks + calibrated ranges (keyed 'input' and each block's out_observer) into a QuantModel."""
    in_scale, in_zp = act_qparams(*ranges["input"])
    cur_scale, cur_zp = in_scale, in_zp
    last_block = max(i for i, it in enumerate(items) if isinstance(it, Block))
    steps: list = []
    for idx, it in enumerate(items):
        if isinstance(it, Block):
            w, b = it.folded()
            wq, ws = weight_qparams(w)
            acc_scale = cur_scale * ws
            bq = np.round(b / acc_scale)
            if np.any(np.abs(bq) > 2**31 - 1):
                raise UnsupportedNetworkError(f"{it.name}: bias does not fit int32 at this input scale")
            layer = QLayer(it.name, "conv" if isinstance(it.layer, ConvOp) else "dense", wq, ws,
                           bq.astype(np.int32), cur_scale, cur_zp, final=idx == last_block)
            if isinstance(it.layer, ConvOp):
                c = it.layer
                layer.conv = {"stride": list(c.stride), "dilation": list(c.dilation), "pad_mode": c.pad_mode,
                              "padding": list(c.padding), "group": c.group}
            if layer.final:
                if it.relu is not None:
                    layer.relu, layer.relu_cap = True, it.relu.cap
            else:
                out_scale, out_zp = act_qparams(*ranges[it.out_observer])
                layer.out_scale, layer.out_zp = out_scale, out_zp
                layer.m0, layer.shift = quantize_multiplier(acc_scale / out_scale)
                if it.relu is not None:
                    layer.relu = True
                    layer.clamp_lo = max(QMIN, out_zp)
                    if it.relu.cap is not None:
                        layer.clamp_hi = int(min(QMAX, out_zp + np.floor(it.relu.cap / out_scale + 0.5)))
                cur_scale, cur_zp = out_scale, out_zp
            steps.append(layer)
        elif isinstance(it, PoolOp):
            steps.append(QStep(it.name, "pool", {"mode": it.mode, "kernel": list(it.kernel), "stride": list(it.stride),
                                                 "pad_mode": it.pad_mode, "padding": list(it.padding)}))
        elif isinstance(it, ReluOp):
            steps.append(QStep(it.name, "relu", {"cap": it.cap}))
        elif isinstance(it, FlattenOp):
            steps.append(QStep(it.name, "flatten"))
        else:
            steps.append(QStep(it.name, "identity"))
    return QuantModel(tuple(input_shape), in_scale, in_zp, steps, method, report)
