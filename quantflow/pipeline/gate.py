"""Stage 6: the accuracy gate -- INT8 emulation against FP32 on held-out images.

FP32: the graph IR run in float32 on the training preprocessing of each image (the IR was
checked against MindSpore in the graph stage).  INT8: each uint8 image as the device receives
it, through the verified AIPP config (float16 output), into the INT8 emulation.  What is compared
and when it passes is the metric's (``quantflow.pipeline.metrics``): top-1 on labelled images
(``compare``), or every output's agreement (``output_stats`` / ``compare_outputs``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..backends import aipp
from ..engine import shard
from ..engine.float_runner import float_runner
from ..engine.int8_emulator import Emulator
from ..errors import DataError
from ..images import load_images, preprocess, scan_images
from ..progress import progress
from .atomic import write_json, write_text


def eval_items(cfg):
    """The held-out images and labels (for an unlabelled folder, its groups); with labels, every class of the
    model must have some (unless allowed)."""
    data_dir = cfg.path(cfg.evaluation.data_dir)
    items = scan_images(data_dir, cfg.labelled_classes)
    labels = np.array([i.label for i in items])
    missing = sorted(set(range(cfg.labelled_classes or 0)) - set(labels.tolist()))
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


def _outputs_shard(shared, paths) -> np.ndarray:
    cfg, graph, folded, qparams, aipp_params = shared
    n, runner, emulator = cfg.normalization, float_runner(graph), Emulator(folded, qparams)
    out = []
    with progress(len(paths), "gate: FP32 and INT8") as bar:
        for images in _batches(cfg, paths):
            fp = runner.run(preprocess(images, n.mean, n.std, n.scale, n.channel_order))
            q = emulator.outputs(aipp_batch(aipp_params, images, cfg.aipp.input_channel_order))
            per_output = []
            for f_name, q_name in zip(graph.outputs, emulator.graph.outputs):
                f = fp[f_name].reshape(len(images), -1).astype(np.float64)
                d = q[q_name].reshape(len(images), -1).astype(np.float64)
                per_output.append(np.stack([np.sum(f * d, 1), np.sum(f * f, 1), np.sum(d * d, 1),
                                            np.sum((f - d) ** 2, 1), np.abs(f - d).max(1)], 1))
            out.append(np.stack(per_output, 1))
            bar.update(len(images))
    return np.concatenate(out)


def output_stats(cfg, graph, folded, qparams, aipp_params: dict) -> np.ndarray:
    """Per held-out image and network output, five statistics of the INT8 emulation (``d``) against FP32
    (``f``): sum f*d, sum f*f, sum d*d, sum (f-d)^2 and max |f-d| (float64, images x outputs x 5).  FP32 and INT8
    run batch by batch side by side and only these sums are kept, so memory stays bounded by the batch
    whatever the heads' size; each image's sums are its own, so any sharding gives the same array."""
    paths, _ = eval_items(cfg)
    return _sharded(_outputs_shard, (cfg, graph, folded, qparams, aipp_params), cfg, paths)


def _cosine(dot, ff, dd):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ff * dd > 0, dot / np.sqrt(ff * dd), np.where((ff == 0) & (dd == 0), 1.0, 0.0))


def compare_outputs(stats: np.ndarray, names: list[str], shapes: list, paths: list, min_cosine: float) -> dict:
    """Each output's cosine similarity and SQNR of INT8 against FP32 over all images (``output_stats``), its
    worst image and largest difference; passes when every output's cosine is at least ``min_cosine``."""
    rows = []
    for k, name in enumerate(names):
        dot, ff, dd, ee = (float(np.sum(stats[:, k, i])) for i in range(4))
        per_image = _cosine(stats[:, k, 0], stats[:, k, 1], stats[:, k, 2])
        worst = int(np.argmin(per_image))
        cosine = float(_cosine(np.float64(dot), np.float64(ff), np.float64(dd)))
        rows.append({"output": name, "shape": list(shapes[k]), "cosine": cosine,
                     "sqnr_db": float(10 * np.log10(ff / ee)) if ee > 0 else float("inf"),
                     "worst_image": str(paths[worst]), "worst_image_cosine": float(per_image[worst]),
                     "max_abs_diff": float(stats[:, k, 4].max()), "passed": bool(cosine >= min_cosine)})
    return {"images": int(len(stats)), "min_cosine": min_cosine, "outputs": rows,
            "least_cosine": min(r["cosine"] for r in rows), "failures": [r["output"] for r in rows if not r["passed"]],
            "passed": all(r["passed"] for r in rows)}


def evaluate(cfg, graph, folded, qparams, aipp_params: dict) -> dict:
    """The accuracy report of ``evaluation.metric`` (top-1, or every output's agreement) on
    ``evaluation.data_dir``."""
    from .metrics import metric

    report = metric(cfg.evaluation.metric).evaluate(cfg, graph, folded, qparams, aipp_params)
    report["metric"] = cfg.evaluation.metric
    report["eval_data"] = str(cfg.evaluation.data_dir)
    report["calibration_method"] = qparams.method
    report["quantized_ops"] = len(qparams.ops)
    return report


def format_table(r: dict) -> str:
    """The report as text: where it was measured, then the metric's own table."""
    from .metrics import metric

    verdict = "PASS" if r["passed"] else "FAIL"
    head = (f"accuracy gate: {verdict}  ({r['images']} held-out images from {r.get('eval_data', '?')}, "
            f"calibration method {r.get('calibration_method', '?')}, {r.get('quantized_ops', '?')} INT8 ops)")
    return "\n".join([head] + metric(r).table(r))


def write_report(report: dict, json_path: Path, txt_path: Path) -> None:
    write_json(json_path, report, sort_keys=False)
    write_text(txt_path, format_table(report) + "\n")
