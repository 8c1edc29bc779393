"""Stage 2: Calibrater insertion and activation-range collection.

MindSpore has no Calibrater of its own; ``Calibrater`` inserts observers into the user's
network as forward hooks (PyNative mode) around every Conv2d/Dense -- its input and its
output -- and after the BatchNorm/ReLU fused into it, runs the calibration images through
the network twice (ranges, then histograms) and turns the observed ranges into INT8
parameters with the configured method.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .errors import UnsupportedNetworkError
from .graph import read_plan, verify_plan
from .quantize import Block, QuantModel, build_blocks, make_quant_model
from .ranges import Observer


class Calibrater:
    """Observers hooked into a MindSpore network.

    Observer names: ``input`` (the network input), ``<layer>:in`` / ``<layer>:out`` for every
    Conv2d/Dense, and ``<op>`` for the last op fused into a block (BatchNorm or ReLU), whose
    range sets the block's requantization scale.
    """

    def __init__(self, net, items: list, bins: int = 2048):
        self.net = net
        self.items = items
        self.bins = bins
        self.observers: dict[str, Observer] = {"input": Observer("input", bins)}
        self._handles = []
        self._calls: dict[str, int] = {}
        self._cells = dict(net.cells_and_names())

    def _cell(self, name: str):
        if name not in self._cells:
            raise UnsupportedNetworkError(f"cannot find layer {name!r} in the network to attach an observer")
        return self._cells[name]

    def insert(self) -> "Calibrater":
        if self._handles:
            return self
        for it in self.items:
            if not isinstance(it, Block):
                continue
            obs_in = self.observers.setdefault(f"{it.name}:in", Observer(f"{it.name}:in", self.bins))
            obs_out = self.observers.setdefault(f"{it.name}:out", Observer(f"{it.name}:out", self.bins))
            self._handles.append(self._cell(it.name).register_forward_hook(self._hook(it.name, obs_in, obs_out)))
            if it.out_name != it.name:
                obs = self.observers.setdefault(it.out_name, Observer(it.out_name, self.bins))
                self._handles.append(self._cell(it.out_name).register_forward_hook(self._hook(it.out_name, None, obs)))
        return self

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self):
        return self.insert()

    def __exit__(self, *exc):
        self.remove()

    def _hook(self, name: str, obs_in: Observer | None, obs_out: Observer):
        def hook(cell, inputs, output):
            self._calls[name] = self._calls.get(name, 0) + 1
            if obs_in is not None:
                obs_in.observe(inputs[0].asnumpy())
            obs_out.observe(output.asnumpy())
        return hook

    def forward(self, x: np.ndarray) -> None:
        from mindspore import Tensor

        self._calls.clear()
        self.observers["input"].observe(x)
        self.net(Tensor(np.ascontiguousarray(x, np.float32)))
        hooked = [it.name for it in self.items if isinstance(it, Block)] + \
                 [it.out_name for it in self.items if isinstance(it, Block) and it.out_name != it.name]
        for name in hooked:
            n = self._calls.get(name, 0)
            if n != 1:
                raise UnsupportedNetworkError(
                    f"layer {name!r} ran {n} times in one forward pass; the quantizer needs every layer to run "
                    f"exactly once (give each use its own cell)")

    def collect(self, batches) -> None:
        """Two passes over ``batches`` (a re-iterable of float N,C,H,W arrays)."""
        for x in batches:
            self.forward(x)
        for obs in self.observers.values():
            obs.start_histograms()
        for x in batches:
            self.forward(x)


def _batches(x: np.ndarray, size: int) -> list[np.ndarray]:
    return [x[i:i + size] for i in range(0, len(x), size)]


def calibrate(net, x, input_shape, method: str, percentile: float = 99.99, bins: int = 2048,
              batch_size: int = 32) -> QuantModel:
    """Quantize ``net`` with calibration inputs ``x``: preprocessed float N,C,H,W, as one array or
    as a re-iterable of such batches (e.g. ``images.ImageBatches``, which reads them lazily)."""
    import mindspore as ms

    if ms.get_context("mode") != ms.PYNATIVE_MODE:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    batches = _batches(x, batch_size) if isinstance(x, np.ndarray) else x
    first = next(iter(batches), None)
    if first is None or len(first) == 0:
        raise ValueError("no calibration inputs")
    plan = read_plan(net)
    verify_plan(plan, net, first[:16])
    items = build_blocks(plan)
    cal = Calibrater(net, items, bins)
    with cal:
        cal.collect(batches)
    ranges, report = {}, {}
    for name, obs in cal.observers.items():
        lo, hi = obs.range(method, percentile)
        ranges[name] = (lo, hi)
        report[name] = {**obs.summary(), "lo": lo, "hi": hi}
    return make_quant_model(items, input_shape, ranges, method, report)


def write_quant_params(model: QuantModel, out_dir: Path) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    js, npz = out_dir / "qparams.json", out_dir / "qparams.npz"
    model.save(js, npz)
    return js, npz


def load_quant_params(out_dir: Path) -> QuantModel:
    return QuantModel.load(Path(out_dir) / "qparams.json", Path(out_dir) / "qparams.npz")


def summary_table(model: QuantModel) -> str:
    rows = [f"{'observer':<28} {'min':>10} {'max':>10} {'lo':>10} {'hi':>10}"]
    for name, r in model.ranges.items():
        rows.append(f"{name:<28} {r['min']:>10.4f} {r['max']:>10.4f} {r['lo']:>10.4f} {r['hi']:>10.4f}")
    return "\n".join(rows)


def dump_json(path: Path, data) -> None:
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
