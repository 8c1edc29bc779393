"""The evaluation runs: FP32 and the INT8 emulation over a held-out image set, sharded over ``[engine]``.

FP32: the graph IR run in float32 on the training preprocessing of each image (the IR was checked against the
source runtime in the graph stage).  INT8: each uint8 image as the device receives it, through the verified
AIPP config (float16 output), into the emulation of the deploy graph.  The images are read one evaluation
batch at a time (memory bounded by the batch); shards are contiguous runs of whole batches, so any engine
gives the same numbers bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.images import load_images, preprocess, scan_images
from ..engine import shard
from ..engine.aipp import aipp_batch
from ..engine.int8_emulator import Emulator
from ..engine.runner import float_runner
from ..errors import DataError
from ..progress import progress


@dataclass(frozen=True)
class HeldOut:
    """A held-out image set and how its images reach FP32 and INT8."""
    paths: tuple[Path, ...]
    labels: np.ndarray            # class labels (labelled folders) or group indices
    names: tuple[str, ...]        # the paths as the report shows them
    shape: tuple[int, int, int]   # C, H, W
    normalization: tuple          # (mean, std, scale, channel_order): the training preprocessing
    frame_order: str              # the channel order of the frames the device is fed (aipp.input_channel_order)
    batch_size: int
    engine: object = None         # [engine]: where the shards run

    def __len__(self) -> int:
        return len(self.paths)

    def batches(self, paths=None):
        """The images of ``paths`` (default: all), one evaluation batch of uint8 images at a time."""
        paths = self.paths if paths is None else paths
        c, h, w = self.shape
        for s in range(0, len(paths), self.batch_size):
            yield load_images(paths[s:s + self.batch_size], c, h, w)


def held_out(data_dir: Path, classes: int | None, allow_missing_classes: bool, root: Path, **how) -> HeldOut:
    """The held-out images of ``data_dir``: per-class folders of ``classes`` classes (every class must have some,
    unless allowed), or for ``classes`` None an unlabelled folder (its groups as labels).  ``how``: the rest of
    ``HeldOut``'s fields."""
    items = scan_images(data_dir, classes)
    labels = np.array([i.label for i in items])
    missing = sorted(set(range(classes or 0)) - set(labels.tolist()))
    if missing and not allow_missing_classes:
        raise DataError(
            f"evaluation.data_dir {data_dir}: no held-out images for class(es) {', '.join(map(str, missing))} of the "
            f"model's {classes}; the gate would pass without testing them. Add images for them, or set "
            f"evaluation.allow_missing_classes = true")
    paths = tuple(i.path for i in items)
    names = tuple(str(p.relative_to(root) if p.is_relative_to(root) else p) for p in paths)
    return HeldOut(paths, labels, names, **how)


def _stack(parts: list[np.ndarray], n: int) -> np.ndarray:
    return np.concatenate(parts).reshape(n, -1).astype(np.float64)


def _fp32_shard(shared, paths) -> np.ndarray:
    ev, graph = shared
    runner, out = float_runner(graph), []
    with progress(len(paths), "gate: FP32") as bar:
        for images in ev.batches(paths):
            out.append(runner.run(preprocess(images, *ev.normalization))[graph.outputs[0]])
            bar.update(len(images))
    return _stack(out, len(paths))


def _int8_shard(shared, paths) -> np.ndarray:
    ev, deploy, aipp_params = shared
    emulator, out = Emulator(deploy), []
    with progress(len(paths), "gate: INT8") as bar:
        for images in ev.batches(paths):
            out.append(emulator.logits(aipp_batch(aipp_params, images, ev.frame_order)))
            bar.update(len(images))
    return _stack(out, len(paths))


def _sharded(shard_fn, shared, ev: HeldOut) -> np.ndarray:
    """``shard_fn`` over contiguous runs of whole evaluation batches, where ``ev.engine`` says, in order."""
    pieces = shard.split(len(ev.paths), ev.engine.workers if ev.engine else 1, ev.batch_size)
    parts = shard.run(shard_fn, shared, [ev.paths[r.start:r.stop] for r in pieces], ev.engine)
    return np.concatenate(parts)


def fp32_logits(ev: HeldOut, graph) -> np.ndarray:
    """The FP32 first output of each held-out image (images x values): the graph IR on the training
    preprocessing."""
    return _sharded(_fp32_shard, (ev, graph), ev)


def int8_logits(ev: HeldOut, deploy, aipp_params: dict) -> np.ndarray:
    """The INT8 emulation's first output of each held-out image, each fed as the device gets it (through
    AIPP); ``deploy``: the deploy IR (``quantization.deploy.quantized_graph``)."""
    return _sharded(_int8_shard, (ev, deploy, aipp_params), ev)


def _outputs_shard(shared, paths) -> np.ndarray:
    ev, graph, deploy, aipp_params = shared
    runner, emulator = float_runner(graph), Emulator(deploy)
    out = []
    with progress(len(paths), "gate: FP32 and INT8") as bar:
        for images in ev.batches(paths):
            fp = runner.run(preprocess(images, *ev.normalization))
            q = emulator.outputs(aipp_batch(aipp_params, images, ev.frame_order))
            per_output = []
            for f_name, q_name in zip(graph.outputs, emulator.graph.outputs):
                f = fp[f_name].reshape(len(images), -1).astype(np.float64)
                d = q[q_name].reshape(len(images), -1).astype(np.float64)
                per_output.append(np.stack([np.sum(f * d, 1), np.sum(f * f, 1), np.sum(d * d, 1),
                                            np.sum((f - d) ** 2, 1), np.abs(f - d).max(1)], 1))
            out.append(np.stack(per_output, 1))
            bar.update(len(images))
    return np.concatenate(out)


def output_stats(ev: HeldOut, graph, deploy, aipp_params: dict) -> np.ndarray:
    """Per held-out image and network output, five statistics of the INT8 emulation (``d``) against FP32
    (``f``): sum f*d, sum f*f, sum d*d, sum (f-d)^2 and max |f-d| (float64, images x outputs x 5).  FP32 and INT8
    run batch by batch side by side and only these sums are kept, so memory stays bounded by the batch
    whatever the heads' size; each image's sums are its own, so any sharding gives the same array."""
    return _sharded(_outputs_shard, (ev, graph, deploy, aipp_params), ev)
