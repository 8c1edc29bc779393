"""The evaluation runs: FP32 and the INT8 emulation over a held-out image set, sharded over ``[engine]``.

FP32: the graph IR run in float32 on the training preprocessing of each image (the IR was checked against the
source runtime in the graph stage).  INT8: each uint8 image as the device receives it, through the verified
AIPP config (float16 output), into the emulation of the deploy graph.  The images are read one evaluation
batch at a time (memory bounded by the batch); shards are contiguous runs of whole batches, so any engine
gives the same numbers bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..data.images import load_images, preprocess, scan_images
from ..engine import shard
from ..engine.aipp import aipp_batch
from ..engine.int8_emulator import Emulator
from ..engine.runner import float_runner
from ..errors import DataError
from ..io.digest import file_sha256
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


def sharded_parts(shard_fn, shared, ev: HeldOut) -> list:
    """``shard_fn(shared, paths)`` over contiguous runs of whole evaluation batches, where ``ev.engine`` says: the
    shards' results in order."""
    pieces = shard.split(len(ev.paths), ev.engine.workers if ev.engine else 1, ev.batch_size)
    return shard.run(shard_fn, shared, [ev.paths[r.start:r.stop] for r in pieces], ev.engine)


def sharded(shard_fn, shared, ev: HeldOut) -> np.ndarray:
    """``sharded_parts``, the shards' arrays concatenated."""
    return np.concatenate(sharded_parts(shard_fn, shared, ev))


def fp32_logits(ev: HeldOut, graph) -> np.ndarray:
    """The FP32 first output of each held-out image (images x values): the graph IR on the training
    preprocessing."""
    return sharded(_fp32_shard, (ev, graph), ev)


def int8_logits(ev: HeldOut, deploy, aipp_params: dict) -> np.ndarray:
    """The INT8 emulation's first output of each held-out image, each fed as the device gets it (through
    AIPP); ``deploy``: the deploy IR (``quantization.deploy.quantized_graph``)."""
    return sharded(_int8_shard, (ev, deploy, aipp_params), ev)


def output_names(graph, names: dict | None = None) -> list[str]:
    """The network's outputs as the user knows them: ``names`` maps the graph IR's output names to the model
    file's (an ONNX file's declared outputs); the IR's own names where it has none."""
    return [(names or {}).get(o, o) for o in graph.outputs]


MEMO_BYTES = 256 * 2 ** 20   # the most FP32 output bytes a checker keeps between its checks (``Fp32Memo``)


class Fp32Memo:
    """The FP32 outputs of a checker's images, one entry per evaluation batch (its paths -> the batch's outputs,
    keyed as ``output_names``; an output's batch axis need not be its first), kept from its first check for the
    next ones where they fit in ``MEMO_BYTES``: the checks of one image set differ only in the INT8 parameters,
    and FP32 is a third of a check (NudeNet's YOLOv8n, 64 tuning images: 2.3 s of 6.5).  Shards are whole
    batches, so every engine cuts the same batches; reused outputs are the ones computed, so every check's
    numbers are those of a fresh run."""

    def __init__(self, graph, images: int):
        per_image = sum(int(np.prod(graph.shape(o)[1:])) for o in graph.outputs) * 4
        self.fits = images * per_image <= MEMO_BYTES
        self.outputs: dict = {}

    def ask(self) -> tuple[dict | None, bool]:
        """(the outputs to reuse or None, whether this run should send its FP32 outputs back)."""
        return (self.outputs or None), (self.fits and not self.outputs)

    def add(self, kept: list) -> None:
        for k in kept:
            self.outputs.update(k or {})


def memo_sharded(shard_fn, shared: tuple, ev: HeldOut, memo: Fp32Memo | None) -> list:
    """``sharded_parts`` of a shard taking ``shared`` then the FP32 outputs to reuse and whether to keep its own
    (``Fp32Memo.ask``), each part ending with the outputs it kept: the memo takes those in."""
    fp32, keep = memo.ask() if memo else (None, False)
    parts = sharded_parts(shard_fn, (*shared, fp32, keep), ev)
    if memo:
        memo.add([part[-1] for part in parts])
    return parts


def both_outputs(ev: HeldOut, graph, deploy, aipp_params: dict, paths, names: dict | None = None,
                 label: str = "gate: FP32 and INT8", fp32: dict | None = None, keep: dict | None = None):
    """Per evaluation batch of ``paths``: (its paths, uint8 images, FP32 outputs, INT8 outputs), each output dict
    keyed by the network's output names (``output_names``); FP32 and INT8 run side by side, so that only one
    batch of both is ever held.  ``fp32``: outputs already computed (``Fp32Memo.outputs``), not run again;
    ``keep``: a dict to put each batch's FP32 outputs in (by the tuple of its paths)."""
    batches = [tuple(paths[s:s + ev.batch_size]) for s in range(0, len(paths), ev.batch_size)]
    fp32 = fp32 if fp32 is not None and all(b in fp32 for b in batches) else None
    runner, emulator = (float_runner(graph) if fp32 is None else None), Emulator(deploy)
    shown = output_names(graph, names)
    with progress(len(paths), label) as bar:
        for batch in batches:
            images = load_images(list(batch), *ev.shape)
            if fp32 is None:
                run = runner.run(preprocess(images, *ev.normalization))
                fp = {k: run[f] for k, f in zip(shown, graph.outputs)}
            else:
                fp = {k: v.copy() for k, v in fp32[batch].items()}
            if keep is not None:
                keep[batch] = {k: v.copy() for k, v in fp.items()}
            q = emulator.outputs(aipp_batch(aipp_params, images, ev.frame_order))
            yield list(batch), images, fp, {k: q[e] for k, e in zip(shown, emulator.graph.outputs)}
            bar.update(len(images))


def region_sums(fp: dict, q: dict, regions, n: int) -> np.ndarray:
    """Five statistics of INT8 (``d``) against FP32 (``f``) per image and region (``parts.Region``, default: each
    output whole) of one batch of ``n`` images: sum f*d, sum f*f, sum d*d, sum (f-d)^2 and max |f-d| (float64,
    images x regions x 5).  NumPy's own sums, per image: the same numbers however the images are batched."""
    rows = []
    for r in regions:
        f, d = r.take(fp[r.output], n).astype(np.float64), r.take(q[r.output], n).astype(np.float64)
        rows.append(np.stack([np.sum(f * d, 1), np.sum(f * f, 1), np.sum(d * d, 1), np.sum((f - d) ** 2, 1),
                              np.abs(f - d).max(1) if f.shape[1] else np.zeros(n)], 1))
    return np.stack(rows, 1)


def whole_outputs(graph, names: dict | None = None) -> list:
    """Every network output as a whole region (not gated)."""
    from .parts import Region
    return [Region(n, n, tuple(graph.shape(o))) for n, o in zip(output_names(graph, names), graph.outputs)]


def _outputs_shard(shared, paths) -> tuple[np.ndarray, dict | None]:
    ev, graph, deploy, aipp_params, regions, names, fp32, keep = shared
    kept = {} if keep else None
    out = [region_sums(fp, q, regions, len(images))
           for _, images, fp, q in both_outputs(ev, graph, deploy, aipp_params, paths, names, fp32=fp32, keep=kept)]
    return (np.concatenate(out) if out else np.zeros((0, len(regions), 5))), kept


def output_stats(ev: HeldOut, graph, deploy, aipp_params: dict, regions=None, names: dict | None = None,
                 memo: Fp32Memo | None = None) -> np.ndarray:
    """Per held-out image and region (``parts.Region``; default: every network output whole), five statistics of
    the INT8 emulation against FP32 (``region_sums``; images x regions x 5).  FP32 and INT8 run batch by batch
    side by side and only these sums are kept (and, with a ``memo``, the FP32 outputs it has room for), so
    memory stays bounded by the batch whatever the heads' size; each image's sums are its own, so any sharding
    gives the same array.  ``names``: ``output_names``' map (the regions name the outputs by it)."""
    regions = whole_outputs(graph, names) if regions is None else regions
    parts = memo_sharded(_outputs_shard, (ev, graph, deploy, aipp_params, regions, names), ev, memo)
    return np.concatenate([s for s, _ in parts])


# ---------------------------------------------------------------------------------- tuning and gate images
def split_held_out(ev: HeldOut, tune_share: float, seed: int = 0) -> tuple[HeldOut, HeldOut]:
    """(the images the automatic fallback tunes on, the images the gate judges): disjoint, each class (or group)
    spread over both by a seeded shuffle of its own -- of a class of m images, floor(m * tune_share) drawn at
    random (``numpy.random.default_rng((seed, class))``) go to tuning, the rest (at least one) to the gate --
    so that images made in rotation (image i from source i mod k) do not alias into halves of disjoint sources.
    Each half keeps the folder order; the same images and seed give the same halves on any machine."""
    tune: list[int] = []
    for label in np.unique(ev.labels):
        members = np.flatnonzero(ev.labels == label)
        take = int(len(members) * tune_share)
        tune += np.random.default_rng((int(seed), int(label))).permutation(members)[:take].tolist()
    chosen = set(tune)
    return _subset(ev, sorted(tune)), _subset(ev, [i for i in range(len(ev)) if i not in chosen])


def draw(ev: HeldOut, n: int, seed: int = 0) -> HeldOut:
    """``n`` of the images of ``ev`` (all of them when it holds no more), each class (or group) keeping its share
    (largest remainders; ``numpy.random.default_rng((seed, class))`` picks within it), in folder order."""
    if n >= len(ev):
        return ev
    labels, counts = np.unique(ev.labels, return_counts=True)
    exact = counts * n / len(ev)
    take = np.floor(exact).astype(int)
    for k in np.argsort(-(exact - take), kind="stable")[:n - int(take.sum())]:
        take[k] += 1
    index: list[int] = []
    for label, k in zip(labels, take):
        members = np.flatnonzero(ev.labels == label)
        index += np.random.default_rng((int(seed), int(label))).permutation(members)[:k].tolist()
    return _subset(ev, sorted(index))


def leave_out(ev: HeldOut, paths) -> HeldOut:
    """``ev`` without the images of ``paths`` (compared as resolved paths)."""
    gone = {Path(p).resolve() for p in paths}
    return _subset(ev, [i for i, p in enumerate(ev.paths) if Path(p).resolve() not in gone])


def _subset(ev: HeldOut, index: list[int]) -> HeldOut:
    return replace(ev, paths=tuple(ev.paths[i] for i in index), labels=ev.labels[np.asarray(index, int)],
                   names=tuple(ev.names[i] for i in index))


def shared_images(a, b, same_bytes: bool = True) -> list[tuple[Path, Path]]:
    """The images of ``a`` that are also in ``b`` (image paths), as (path in a, path in b): the same file, and with
    ``same_bytes`` files of the same bytes too (only files of equal size are hashed)."""
    ra, rb = {Path(p).resolve(): Path(p) for p in a}, {Path(p).resolve(): Path(p) for p in b}
    both = [(ra[k], rb[k]) for k in ra.keys() & rb.keys()]
    if not same_bytes:
        return sorted(both)
    by_size: dict[int, list[Path]] = {}
    for k in rb.keys() - ra.keys():
        by_size.setdefault(k.stat().st_size, []).append(k)
    digest: dict[Path, str] = {}
    for k in ra.keys() - rb.keys():
        same_size = by_size.get(k.stat().st_size, [])
        if not same_size:
            continue
        for o in same_size:
            digest.setdefault(o, file_sha256(o))
        mine = file_sha256(k)
        match = next((o for o in same_size if digest[o] == mine), None)
        if match is not None:
            both.append((ra[k], rb[match]))
    return sorted(both)
