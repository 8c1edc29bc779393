"""The shipped task metric for DB-style text detectors (``evaluation.metric = "text_regions"``: DBNet, PP-OCR det;
``task.py`` holds the task-metric protocol).

Each image's probability map [1, H, W] (values in 0..1) is read into text boxes as PaddleOCR's inference reads
it (tools/infer/utility.py: ``det_db_thresh`` 0.3, ``det_db_box_thresh`` 0.6; ppocr/postprocess/db_postprocess.py
``DBPostProcess``: ``max_candidates`` 1000, ``min_size`` 3 -- the class's own ``box_thresh`` default is 0.7,
rapidocr-onnxruntime's 0.5): the map binarised at ``thresh``, each connected
region (8-connected, cv2) a candidate, kept when its score -- the mean probability over the region -- is at least
``box_thresh`` and its box's shorter side at least ``min_size`` pixels.  The box is the region's axis-aligned
bounding rectangle, not DBPostProcess' unclipped rotated one: FP32's and INT8's are compared with each other, so
the same reading on both suffices.  INT8's boxes are matched to FP32's at IoU >= ``match_iou`` (0.5; greedy, the
highest-scoring INT8 box first, each FP32 box once).  The numbers: ``f1`` = 2 matched / (FP32 + INT8 boxes),
``precision``, ``recall`` (INT8 against FP32), the counts, and ``pixel_iou``: the intersection over union of the
two binarised maps, summed over the images.

Default limits: ``f1`` >= 0.9 (as the detection metric's: one box in ten lost or displaced) and ``pixel_iou`` >=
0.9 (the text pixels themselves, which a lost box does not show when the region only shrinks).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError
from .detection import match
from .options import read_options
from .shipped import per_image


class TextRegionOptions(BaseModel):
    """``evaluation.options`` of ``evaluation.metric = "text_regions"``."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    output: Optional[str] = Field(default=None, description="the output holding the map (default: the first)")
    thresh: float = Field(default=0.3, gt=0.0, lt=1.0, description="binarisation threshold of the map")
    box_thresh: float = Field(default=0.6, ge=0.0, lt=1.0, description="least mean probability of a region")
    min_size: int = Field(default=3, ge=1, description="least shorter side of a box (pixels)")
    max_candidates: int = Field(default=1000, gt=0, description="most regions read per image")
    match_iou: float = Field(default=0.5, gt=0.0, le=1.0, description="least IoU of a matched INT8 box")


def maps(out: np.ndarray, n: int, name: str = "output") -> np.ndarray:
    """The output of a batch of ``n`` images as n maps [H, W]."""
    a = np.asarray(out)
    if a.ndim == 4 and a.shape[1] == 1:
        a = a[:, 0]
    if a.ndim != 3 or a.shape[0] != n:
        raise ConfigError(f"evaluation.metric text_regions: output {name} {list(np.shape(out))} is not a map "
                          f"[images, 1, H, W] for a batch of {n} images; set evaluation.options.output")
    return a


def boxes(prob: np.ndarray, o: TextRegionOptions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(boxes x1 y1 x2 y2, their scores, the binarised map) of one probability map."""
    import cv2

    bitmap = prob > o.thresh
    count, labels, stats, _ = cv2.connectedComponentsWithStats(bitmap.astype(np.uint8), connectivity=8)
    if count <= 1:
        return np.zeros((0, 4)), np.zeros(0), bitmap
    sums = np.bincount(labels.reshape(-1), weights=prob.reshape(-1).astype(np.float64), minlength=count)[1:]
    areas = stats[1:, cv2.CC_STAT_AREA]
    scores = sums / areas
    x, y, w, h = (stats[1:, k] for k in (cv2.CC_STAT_LEFT, cv2.CC_STAT_TOP, cv2.CC_STAT_WIDTH, cv2.CC_STAT_HEIGHT))
    found = np.stack([x, y, x + w, y + h], 1).astype(np.float64)
    keep = (scores >= o.box_thresh) & (np.minimum(w, h) >= o.min_size)
    found, scores = found[keep][:o.max_candidates], scores[keep][:o.max_candidates]
    return found, scores, bitmap


class TextRegions:
    """The task metric (``task.py``'s class form, one record per image)."""
    records_per_image = True
    limits = {"min": {"f1": 0.9, "pixel_iou": 0.9}}
    outcome = "boxes"   # what changed() counts

    @staticmethod
    def changed(record: dict) -> int:
        """The text boxes INT8 changes in one image: FP32's it misses and its own FP32 does not have."""
        return record["fp32"] + record["int8"] - 2 * record["matched"]

    def __init__(self, **options):
        self.o = read_options(TextRegionOptions, options, "text_regions")

    def batch(self, fp32: dict, int8: dict, batch) -> list[dict]:
        """Per image: the box counts, the matches, and the two binarised maps' intersection and union."""
        name = self.o.output or next(iter(fp32))
        if name not in fp32:
            raise ConfigError(f"evaluation.options.output: the network has no output {name!r} "
                              f"(its outputs: {', '.join(fp32)})")
        n = len(batch.paths)
        f, q = maps(fp32[name], n, name), maps(int8[name], n, name)
        records = []
        for i in range(n):
            fb, _, fm = boxes(f[i], self.o)
            qb, qs, qm = boxes(q[i], self.o)
            hits = match(fb, np.zeros(len(fb), int), qb, np.zeros(len(qb), int), qs, self.o.match_iou)
            records.append({"fp32": len(fb), "int8": len(qb), "matched": int(hits.sum()),
                            "intersection": int(np.sum(fm & qm)), "union": int(np.sum(fm | qm))})
        return records

    def summarize(self, records: list) -> dict:
        records = per_image(records)
        nf, nq, m, inter, union = (sum(r[k] for r in records) for k in ("fp32", "int8", "matched", "intersection",
                                                                          "union"))
        return {"f1": 2 * m / (nf + nq) if nf + nq else None, "precision": m / nq if nq else None,
                "recall": m / nf if nf else None, "pixel_iou": inter / union if union else None,
                "fp32_boxes": nf, "int8_boxes": nq, "matched": m}
