"""Stage 6: the accuracy gate -- INT8 emulation against FP32 on held-out images.

FP32: the graph IR run in float32 on the training preprocessing of each image (the IR was
checked against MindSpore in the graph stage).  INT8: each uint8 image as the device receives
it, through the verified AIPP config (float16 output), into the INT8 emulation.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..backends import aipp
from ..engine import shard
from ..engine.float_runner import float_runner
from ..engine.int8_emulator import Emulator
from ..errors import DataError
from ..images import load_images, preprocess, scan_class_folders
from ..progress import progress
from .atomic import write_json, write_text


def eval_items(cfg):
    """The held-out images and labels; every class of the model must have some (unless allowed)."""
    data_dir = cfg.path(cfg.evaluation.data_dir)
    items = scan_class_folders(data_dir, cfg.model.num_classes)
    labels = np.array([i.label for i in items])
    missing = sorted(set(range(cfg.model.num_classes)) - set(labels.tolist()))
    if missing and not cfg.evaluation.allow_missing_classes:
        raise DataError(
            f"evaluation.data_dir {data_dir}: no held-out images for class(es) {', '.join(map(str, missing))} of the "
            f"model's {cfg.model.num_classes}; the gate would pass without testing them. Add images for them, or set "
            f"evaluation.allow_missing_classes = true")
    return [i.path for i in items], labels


def aipp_batch(params: dict, images: np.ndarray, input_channel_order: str) -> np.ndarray:
    """The float16 AIPP output the device feeds the first layer, for uint8 images as OpenCV reads them."""
    return np.stack([aipp.apply(params, aipp.device_frame(img, input_channel_order)) for img in images])


def compare(fp: np.ndarray, q: np.ndarray, labels: np.ndarray, threshold: float,
            max_class_drop: float | None = None) -> dict:
    """Top-1 of both, overall and per class; passes when the overall drop is within ``threshold`` and, when
    ``max_class_drop`` is given, no class drops more than that."""
    fp_pred, q_pred = fp.argmax(1), q.argmax(1)
    fp_acc = float((fp_pred == labels).mean())
    q_acc = float((q_pred == labels).mean())
    drop = fp_acc - q_acc
    per_class = {}
    for c in np.unique(labels):
        m = labels == c
        per_class[str(int(c))] = {"images": int(m.sum()), "fp32_top1": float((fp_pred[m] == c).mean()),
                                  "int8_top1": float((q_pred[m] == c).mean())}
    scale = np.abs(fp).max() if fp.size else 1.0
    class_failures = [] if max_class_drop is None else [
        c for c, v in per_class.items() if v["fp32_top1"] - v["int8_top1"] > max_class_drop + 1e-12]
    return {
        "images": int(len(labels)),
        "fp32_top1": fp_acc,
        "int8_top1": q_acc,
        "drop": drop,
        "threshold": threshold,
        "passed": bool(drop <= threshold + 1e-12) and not class_failures,
        "max_class_drop": max_class_drop,
        "class_failures": class_failures,
        "top1_agreement": float((fp_pred == q_pred).mean()),
        "max_abs_logit_diff": float(np.abs(fp - q).max()),
        "relative_logit_error": float(np.abs(fp - q).mean() / max(scale, 1e-12)),
        "per_class": per_class,
    }


def _batches(cfg, paths):
    """The held-out images, one batch at a time (memory bounded by the batch)."""
    _, c, h, w = cfg.model.input_shape
    bs = cfg.evaluation.batch_size
    for s in range(0, len(paths), bs):
        yield load_images(paths[s:s + bs], c, h, w)


def _stack(parts: list[np.ndarray], n: int) -> np.ndarray:
    return np.concatenate(parts).reshape(n, -1).astype(np.float64)


def _fp32_shard(shared, paths) -> np.ndarray:
    cfg, graph = shared
    n, runner = cfg.normalization, float_runner(graph)
    out = []
    with progress(len(paths), "gate: FP32") as bar:
        for images in _batches(cfg, paths):
            out.append(runner.run(preprocess(images, n.mean, n.std, n.scale, n.channel_order))[graph.outputs[0]])
            bar.update(len(images))
    return _stack(out, len(paths))


def _int8_shard(shared, paths) -> np.ndarray:
    cfg, folded, qparams, aipp_params = shared
    emulator, out = Emulator(folded, qparams), []
    with progress(len(paths), "gate: INT8") as bar:
        for images in _batches(cfg, paths):
            out.append(emulator.logits(aipp_batch(aipp_params, images, cfg.aipp.input_channel_order)))
            bar.update(len(images))
    return _stack(out, len(paths))


def _sharded(shard_fn, shared, cfg, paths: list) -> np.ndarray:
    """``shard_fn`` over contiguous runs of whole evaluation batches, where cfg.engine says, in order."""
    pieces = shard.split(len(paths), cfg.engine.workers, cfg.evaluation.batch_size)
    parts = shard.run(shard_fn, shared, [paths[r.start:r.stop] for r in pieces], cfg.engine)
    return np.concatenate(parts)


def fp32_logits(cfg, graph) -> tuple[np.ndarray, np.ndarray]:
    """(FP32 logits, labels) of the held-out images: the graph IR on the training preprocessing."""
    paths, labels = eval_items(cfg)
    return _sharded(_fp32_shard, (cfg, graph), cfg, paths), labels


def int8_logits(cfg, folded, qparams, aipp_params: dict) -> np.ndarray:
    """The INT8 emulation's logits of the held-out images, each fed as the device gets it (through AIPP)."""
    paths, _ = eval_items(cfg)
    return _sharded(_int8_shard, (cfg, folded, qparams, aipp_params), cfg, paths)


def evaluate(cfg, graph, folded, qparams, aipp_params: dict) -> dict:
    """Top-1 of FP32 and of the INT8 emulation on ``evaluation.data_dir``."""
    fp, labels = fp32_logits(cfg, graph)
    q = int8_logits(cfg, folded, qparams, aipp_params)
    report = compare(fp, q, labels, cfg.evaluation.threshold, cfg.evaluation.max_class_drop)
    report["eval_data"] = str(cfg.evaluation.data_dir)
    report["calibration_method"] = qparams.method
    report["quantized_ops"] = len(qparams.ops)
    return report


def format_table(r: dict) -> str:
    verdict = "PASS" if r["passed"] else "FAIL"
    lines = [
        f"accuracy gate: {verdict}  ({r['images']} held-out images from {r.get('eval_data', '?')}, "
        f"calibration method {r.get('calibration_method', '?')}, {r.get('quantized_ops', '?')} INT8 ops)",
        f"  {'model':<8} {'top-1':>8}",
        f"  {'FP32':<8} {r['fp32_top1'] * 100:>7.2f}%",
        f"  {'INT8':<8} {r['int8_top1'] * 100:>7.2f}%",
        f"  drop {r['drop'] * 100:+.2f} points (allowed {r['threshold'] * 100:.2f}); "
        f"top-1 agreement {r['top1_agreement'] * 100:.2f}%",
        f"  {'class':<8} {'images':>6} {'FP32':>8} {'INT8':>8}",
    ]
    for c, v in r["per_class"].items():
        lines.append(f"  {c:<8} {v['images']:>6} {v['fp32_top1'] * 100:>7.2f}% {v['int8_top1'] * 100:>7.2f}%")
    for c in r.get("class_failures", []):
        v = r["per_class"][c]
        lines.append(f"  class {c} drops {(v['fp32_top1'] - v['int8_top1']) * 100:.2f} points, more than "
                     f"evaluation.max_class_drop {r['max_class_drop'] * 100:.2f}")
    return "\n".join(lines)


def write_report(report: dict, json_path: Path, txt_path: Path) -> None:
    write_json(json_path, report, sort_keys=False)
    write_text(txt_path, format_table(report) + "\n")
