"""Stage 6: the accuracy gate -- INT8 (integer emulator) against FP32 (MindSpore) on held-out images."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from . import emulator
from .images import ImageBatches, scan_class_folders


def load_eval_set(cfg) -> tuple[ImageBatches, np.ndarray]:
    """Lazily read batches of the held-out images, and their labels."""
    items = scan_class_folders(cfg.path(cfg.evaluation.data_dir), cfg.model.num_classes)
    return (ImageBatches.for_config(cfg, [i.path for i in items], cfg.evaluation.batch_size),
            np.array([i.label for i in items]))


def fp32_logits(net, x: np.ndarray) -> np.ndarray:
    from mindspore import Tensor
    return net(Tensor(np.ascontiguousarray(x, np.float32))).asnumpy().astype(np.float64)


def compare(fp: np.ndarray, q: np.ndarray, labels: np.ndarray, threshold: float) -> dict:
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
    return {
        "images": int(len(labels)),
        "fp32_top1": fp_acc,
        "int8_top1": q_acc,
        "drop": drop,
        "threshold": threshold,
        "passed": bool(drop <= threshold + 1e-12),
        "top1_agreement": float((fp_pred == q_pred).mean()),
        "max_abs_logit_diff": float(np.abs(fp - q).max()),
        "relative_logit_error": float(np.abs(fp - q).mean() / max(scale, 1e-12)),
        "per_class": per_class,
    }


def evaluate(cfg, net, qmodel) -> dict:
    batches, y = load_eval_set(cfg)
    fp, q = [], []
    for x in batches:  # one batch of images in memory at a time
        fp.append(fp32_logits(net, x))
        q.append(emulator.run(qmodel, x))
    report = compare(np.concatenate(fp), np.concatenate(q), y, cfg.evaluation.threshold)
    report["eval_data"] = str(cfg.evaluation.data_dir)
    report["calibration_method"] = qmodel.method
    return report


def format_table(r: dict) -> str:
    verdict = "PASS" if r["passed"] else "FAIL"
    lines = [
        f"accuracy gate: {verdict}  ({r['images']} held-out images from {r.get('eval_data', '?')}, "
        f"calibration method {r.get('calibration_method', '?')})",
        f"  {'model':<8} {'top-1':>8}",
        f"  {'FP32':<8} {r['fp32_top1'] * 100:>7.2f}%",
        f"  {'INT8':<8} {r['int8_top1'] * 100:>7.2f}%",
        f"  drop {r['drop'] * 100:+.2f} points (allowed {r['threshold'] * 100:.2f}); "
        f"top-1 agreement {r['top1_agreement'] * 100:.2f}%",
        f"  {'class':<8} {'images':>6} {'FP32':>8} {'INT8':>8}",
    ]
    for c, v in r["per_class"].items():
        lines.append(f"  {c:<8} {v['images']:>6} {v['fp32_top1'] * 100:>7.2f}% {v['int8_top1'] * 100:>7.2f}%")
    return "\n".join(lines)


def write_report(report: dict, json_path: Path, txt_path: Path) -> None:
    Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    Path(txt_path).write_text(format_table(report) + "\n")
