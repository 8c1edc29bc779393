"""The shipped task metric for semantic segmentation heads (``evaluation.metric = "segmentation"``; ``task.py``
holds the task-metric protocol).

Each image's output [classes, H, W] (logits or probabilities; the class axis ``options.axis``, 1 of the batch's
[images, classes, H, W]) is read by the per-pixel argmax, and INT8's class map is compared with FP32's: ``miou``,
the mean over the classes FP32 predicts anywhere in the held-out images of the class's intersection over union
(each summed over the images first, as mIoU over a data set is); ``pixel_agreement``, the share of pixels both
give the same class.  FP32 stands as the reference; the numbers say how far INT8 moves from it.

A **one-channel mask** ([images, 1, H, W], or [images, H, W, 1] with ``options.axis`` 3: a person or selfie
segmenter's sigmoid) has one class, the foreground: a pixel is foreground where its probability exceeds
``options.threshold`` (0.5), the probability being the output itself (``options.activation`` ``"none"``: the
network ends in its sigmoid) or the sigmoid of it (``"sigmoid"``: the output is logits, so the threshold 0.5 is a
logit above 0).  ``miou`` is then the mean IoU over its one class, the foreground's IoU (its intersection and union
summed over the images; not measured when FP32 finds no foreground in any image) -- the same number under the same
limit as a class map's -- and ``pixel_agreement`` the share of pixels both call alike.  An image with no
foreground in either network adds agreeing pixels and nothing to the IoU; one where INT8 alone finds some adds to
the union.

``changed(record)``: the pixels of one image whose class (mask: foreground or not) INT8 changes.

Default limits: ``miou`` >= 0.9 and ``pixel_agreement`` >= 0.98: quantization should move boundaries by a
pixel, not classes; a small class losing a tenth of its pixels already costs mIoU more than that.
"""
from __future__ import annotations

from typing import Literal, Optional

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
    activation: Literal["none", "sigmoid"] = Field(
        default="none", description="a one-channel mask: none (the output is the probability) or sigmoid (logits)")
    threshold: float = Field(default=0.5, gt=0.0, lt=1.0, description="a one-channel mask: the least foreground "
                                                                       "probability (exceeded)")


def class_maps(out: np.ndarray, n: int, axis: int, name: str = "output") -> np.ndarray:
    """The per-pixel argmax of a batch's output, [n, H, W]."""
    a = np.asarray(out)
    if a.ndim < 3 or a.shape[0] != n or axis >= a.ndim or a.shape[axis] < 2:
        raise ConfigError(f"evaluation.metric segmentation: output {name} {list(a.shape)} is not class scores "
                          f"[images, classes, H, W] (class axis {axis}) for a batch of {n} images; set "
                          f"evaluation.options.output / axis")
    return a.argmax(axis)


def foreground(out: np.ndarray, n: int, o: SegmentationOptions, name: str = "output") -> np.ndarray:
    """The foreground of a batch's one-channel mask (the channel on ``o.axis``), [n, H, W] booleans."""
    a = np.asarray(out, np.float64)
    if a.ndim != 4 or a.shape[0] != n or o.axis >= a.ndim or a.shape[o.axis] != 1:
        raise ConfigError(f"evaluation.metric segmentation: output {name} {list(a.shape)} is not a one-channel mask "
                          f"[images, 1, H, W] or [images, H, W, 1] (channel axis {o.axis}) for a batch of {n} "
                          f"images; set evaluation.options.output / axis")
    a = np.squeeze(a, o.axis)
    prob = 0.5 * (1.0 + np.tanh(a / 2)) if o.activation == "sigmoid" else a   # the sigmoid, overflow-free
    return prob > o.threshold


class Segmentation:
    """The task metric (``task.py``'s class form, one record per image)."""
    records_per_image = True
    limits = {"min": {"miou": 0.9, "pixel_agreement": 0.98}}
    outcome = "pixels"   # what changed() counts

    def __init__(self, **options):
        self.o = read_options(SegmentationOptions, options, "segmentation")

    def changed(self, record: dict) -> float:
        """The pixels of one image whose class (a mask's: foreground or not) INT8 changes."""
        return float(record["pixels"] - record["agree"])

    def batch(self, fp32: dict, int8: dict, batch) -> list[dict]:
        """Per image: per class (a mask's one class: the foreground), the pixels FP32 gives it, the intersection
        and union of the two class maps; the pixels both agree on."""
        name = self.o.output or next(iter(fp32))
        if name not in fp32:
            raise ConfigError(f"evaluation.options.output: the network has no output {name!r} "
                              f"(its outputs: {', '.join(fp32)})")
        n = len(batch.paths)
        shape = np.shape(fp32[name])
        classes = shape[self.o.axis] if len(shape) > self.o.axis else 0
        if len(shape) == 4 and shape[-1] == 1 and classes != 1:   # else H would be read as the classes
            raise ConfigError(f"evaluation.options.axis: output {name} {list(shape)} is a one-channel mask with its "
                              f"channel last; set axis = 3 (axis {self.o.axis} holds {classes})")
        if classes == 1:
            return self._masks(foreground(fp32[name], n, self.o, name), foreground(int8[name], n, self.o, name))
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

    @staticmethod
    def _masks(f: np.ndarray, q: np.ndarray) -> list[dict]:
        records = []
        for a, b in zip(f, q):
            inter = int(np.sum(a & b))
            records.append({"fp32": np.asarray([a.sum()]), "intersection": np.asarray([inter]),
                            "union": np.asarray([int(np.sum(a | b))]), "agree": int(np.sum(a == b)),
                            "pixels": int(a.size)})
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
