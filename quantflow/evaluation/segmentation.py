"""The shipped task metric for semantic segmentation heads (``evaluation.metric = "segmentation"``; ``task.py``
holds the task-metric protocol).

Each image's output [classes, H, W] (logits or probabilities; the class axis ``options.axis``, 1 of the batch's
[images, classes, H, W]) is read by the per-pixel argmax, and INT8's class map is compared with FP32's: ``miou``,
the mean over the classes FP32 predicts anywhere in the held-out images of the class's intersection over union
(each summed over the images first, as mIoU over a data set is); ``pixel_agreement``, the share of pixels both
give the same class.  FP32 stands as the reference; the numbers say how far INT8 moves from it.

Default limits: ``miou`` >= 0.9 and ``pixel_agreement`` >= 0.98: quantization should move boundaries by a
pixel, not classes; a small class losing a tenth of its pixels already costs mIoU more than that.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError
from .options import read_options
from .shipped import per_image


class SegmentationOptions(BaseModel):
    """``evaluation.options`` of ``evaluation.metric = "segmentation"``."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    output: Optional[str] = Field(default=None, description="the output holding the class scores (default: the first)")
    axis: int = Field(default=1, ge=1, description="the class axis of the output (the images' axis is 0)")


def class_maps(out: np.ndarray, n: int, axis: int, name: str = "output") -> np.ndarray:
    """The per-pixel argmax of a batch's output, [n, H, W]."""
    a = np.asarray(out)
    if a.ndim < 3 or a.shape[0] != n or axis >= a.ndim or a.shape[axis] < 2:
        raise ConfigError(f"evaluation.metric segmentation: output {name} {list(a.shape)} is not class scores "
                          f"[images, classes, H, W] (class axis {axis}) for a batch of {n} images; set "
                          f"evaluation.options.output / axis")
    return a.argmax(axis)


class Segmentation:
    """The task metric (``task.py``'s class form, one record per image)."""
    records_per_image = True
    limits = {"min": {"miou": 0.9, "pixel_agreement": 0.98}}

    def __init__(self, **options):
        self.o = read_options(SegmentationOptions, options, "segmentation")

    def batch(self, fp32: dict, int8: dict, batch) -> list[dict]:
        """Per image: per class, the pixels FP32 gives it, the intersection and union of the two class maps; the
        pixels both agree on."""
        name = self.o.output or next(iter(fp32))
        if name not in fp32:
            raise ConfigError(f"evaluation.options.output: the network has no output {name!r} "
                              f"(its outputs: {', '.join(fp32)})")
        n = len(batch.paths)
        classes = np.shape(fp32[name])[self.o.axis] if np.ndim(fp32[name]) > self.o.axis else 0
        f = class_maps(fp32[name], n, self.o.axis, name)
        q = class_maps(int8[name], n, self.o.axis, name)
        records = []
        for i in range(n):
            a, b = f[i].reshape(-1), q[i].reshape(-1)
            fc, qc = np.bincount(a, minlength=classes), np.bincount(b, minlength=classes)
            inter = np.bincount(a[a == b], minlength=classes)
            records.append({"fp32": fc, "intersection": inter, "union": fc + qc - inter,
                            "agree": int(inter.sum()), "pixels": int(a.size)})
        return records

    def summarize(self, records: list) -> dict:
        records = per_image(records)
        if not records:
            return {"miou": None, "pixel_agreement": None}
        fc = np.sum([r["fp32"] for r in records], 0)
        inter = np.sum([r["intersection"] for r in records], 0)
        union = np.sum([r["union"] for r in records], 0)
        present = fc > 0
        pixels = sum(r["pixels"] for r in records)
        return {"miou": float(np.mean(inter[present] / union[present])) if present.any() else None,
                "pixel_agreement": sum(r["agree"] for r in records) / pixels if pixels else None,
                "classes": int(present.sum())}
