"""The shipped task metric for YOLO-style detectors (``evaluation.metric = "detection"``; ``task.py`` holds the
task-metric protocol).

For each held-out image, the detections of FP32 and of INT8 -- the head decoded, a score threshold, class-wise
greedy NMS (as Ultralytics' and YOLOv5's ``non_max_suppression``: each anchor's best class, boxes offset per
class) -- are matched: an INT8 detection is a match when an FP32 detection of the same class, not yet matched,
overlaps it at IoU >= ``match_iou`` (greedy, highest INT8 score first).  The numbers: ``f1`` = 2 matched /
(FP32 + INT8 detections), ``precision``, ``recall`` (INT8 against FP32), the counts.  When the held-out folder
has YOLO-format label files (``<image>.txt`` beside the image, or ``labels/`` beside ``images/``: one
``class cx cy w h`` line per object, normalized to the image size; a polygon line is taken as its bounding
box), also ``map50_fp32``, ``map50_int8`` (mean over the labelled classes of the all-point interpolated average
precision at IoU 0.5, PASCAL VOC 2010+) and ``map50_drop``; an image without a label file then holds no object.
Default limits: ``f1`` >= 0.9 and, with labels, ``map50_drop`` <= 0.01.

What the fallback steers by (``steering``): the scores and boxes where a box is or nearly is, INT8 against FP32 --
at each anchor and class that either network scores at least half the score threshold (``BAND``: FP32's boxes,
matched or missed by INT8, INT8's extra ones, and the near-misses of both), the score of both and the box of both,
summed over the images into an SQNR of the scores and one of the boxes (the box error relative to its
half-extents), the lesser steering.  F1 counts boxes that cross the threshold, so on a few hundred images it moves
by a few near-threshold boxes as much as by a layer; the scores around the threshold move with every one of them,
and a layer's harm to anchors no network scores near it cannot change a box.  Measured (docs/detectors.md): on
NudeNet's YOLOv8n (two image seeds) and ddddocr's YOLOX it makes the decisions the parts' SQNR makes; the same
measure at the detections alone (after NMS) steered worse: it kept 3 layers and the gate read F1 0.977, where this
keeps 8 and reads 0.986 (a 0.98 limit).

Layouts (``options.layout``; ``parts.head_layout`` recognises the first two from the shape):
- ``yolov8``: [batch, 4 + classes, anchors], cx, cy, w, h in input pixels, then class scores (Ultralytics v8/v11);
- ``yolov8_anchors_first``: the same values as [batch, anchors, 4 + classes] (mindyolo's YOLOv8 detect head);
- ``yolov5``: [batch, anchors, 5 + classes], cx, cy, w, h, objectness, class scores; score = objectness x class
  (YOLOv5, v7, YOLOX exported with its decoding);
- ``yolox``: YOLOX's raw head, [batch, anchors, 5 + classes] with x, y offsets in grid cells and log w, h, the
  anchors of strides ``options.strides`` (8, 16, 32) in row-major grid order, decoded as YOLOX's
  ``decode_outputs`` does: xy = (offset + cell) * stride, wh = exp(log wh) * stride.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigError, DataError
from .parts import head_layout
from .steering import least_sqnr

MAX_WH = 7680.0   # the per-class box offset of class-wise NMS (Ultralytics' max_wh)
BAND = 0.5        # the steering figure compares the anchors either network scores at least this share of the threshold


class DetectionOptions(BaseModel):
    """``evaluation.options`` of ``evaluation.metric = "detection"``."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    output: Optional[str] = Field(default=None, description="the output holding the detections (default: the first)")
    layout: Literal["auto", "yolov8", "yolov8_anchors_first", "yolov5", "yolox"] = "auto"
    score_threshold: float = Field(default=0.25, gt=0.0, lt=1.0)
    nms_iou: float = Field(default=0.45, gt=0.0, le=1.0)
    match_iou: float = Field(default=0.5, gt=0.0, le=1.0)
    max_detections: int = Field(default=300, gt=0)
    strides: tuple[int, ...] = Field(default=(8, 16, 32), min_length=1, description="layout yolox: the head's strides")
    labels: bool = Field(default=True, description="use YOLO-format label files beside the images, when there are any")


def check_options(options: dict) -> None:
    """ValueError naming the ``evaluation.options`` field at fault, if any."""
    try:
        DetectionOptions(**options)
    except ValidationError as err:
        e = err.errors()[0]
        field = ".".join(str(p) for p in e["loc"])
        said = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        raise ValueError(f"evaluation.options.{field}: {said} (the detection metric's options: "
                         f"{', '.join(DetectionOptions.model_fields)})") from None


# ------------------------------------------------------------------------------------------------ geometry
def xyxy(b: np.ndarray) -> np.ndarray:
    """cx, cy, w, h -> x1, y1, x2, y2."""
    half = b[..., 2:4] / 2
    return np.concatenate([b[..., :2] - half, b[..., :2] + half], -1)


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of boxes ``a`` (k x 4) and ``b`` (m x 4), x1 y1 x2 y2."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), -1)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), -1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / union, 0.0)


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, threshold: float, limit: int) -> np.ndarray:
    """Indices kept by greedy class-wise NMS, highest score first (ties: the lower index first), at most ``limit``."""
    shifted = boxes + (classes[:, None] * MAX_WH)
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size and len(keep) < limit:
        i = order[0]
        keep.append(i)
        order = order[1:][iou(shifted[i:i + 1], shifted[order[1:]])[0] <= threshold]
    return np.asarray(keep, int)


def match(ref_boxes, ref_classes, boxes, classes, scores, threshold: float) -> np.ndarray:
    """Which of ``boxes`` match a reference box of the same class at IoU >= ``threshold``: greedy, highest score
    first, each reference used once, each box taking the best-overlapping free reference."""
    hit = np.zeros(len(boxes), bool)
    if not len(boxes) or not len(ref_boxes):
        return hit
    overlap = iou(boxes, ref_boxes)
    overlap[classes[:, None] != ref_classes[None, :]] = 0.0
    free = np.ones(len(ref_boxes), bool)
    for i in np.argsort(-scores, kind="stable"):
        cand = np.where(free, overlap[i], -1.0)
        j = int(np.argmax(cand))
        if cand[j] >= threshold:
            hit[i], free[j] = True, False
    return hit


def average_precision(tp: np.ndarray, scores: np.ndarray, n_objects: int) -> float:
    """All-point interpolated AP (PASCAL VOC 2010+) of detections (``tp`` flags, ``scores``) against
    ``n_objects`` labelled objects."""
    if n_objects == 0:
        return float("nan")
    order = np.argsort(-scores, kind="stable")
    hits = np.cumsum(tp[order])
    recall = hits / n_objects
    precision = hits / np.arange(1, len(order) + 1)
    mrec = np.concatenate([[0.0], recall, [1.0]])
    mpre = np.concatenate([[0.0], precision, [0.0]])
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    step = np.where(mrec[1:] != mrec[:-1])[0]
    return float(np.sum((mrec[step + 1] - mrec[step]) * mpre[step + 1]))


# ------------------------------------------------------------------------------------------------ decoding
def _layout(o: DetectionOptions, name: str, shape) -> str:
    if o.layout != "auto":
        return o.layout
    found = head_layout((1,) + tuple(shape[1:]))
    if found is None:
        raise ConfigError(f"evaluation.options.layout: output {name} {list(shape)} is not a YOLO head layout the "
                          f"detection metric knows ([batch, 4 + classes, anchors] or [batch, anchors, 5 + classes]); "
                          f"set layout, or gate it with evaluation.metric = \"outputs\" and evaluation.parts")
    return found


def decode(out: np.ndarray, layout: str, height: int, width: int, strides=(8, 16, 32)):
    """(boxes cx, cy, w, h; best class score; best class) per anchor of each image of a batch's output."""
    a = np.asarray(out, np.float64)
    if layout in ("yolov8", "yolov8_anchors_first"):
        a = a.transpose(0, 2, 1) if layout == "yolov8" else a
        cls = a[..., 4:]
        return a[..., :4], cls.max(-1), cls.argmax(-1)
    cls = a[..., 5:]
    best = cls.argmax(-1)
    score = a[..., 4] * np.take_along_axis(cls, best[..., None], -1)[..., 0]
    boxes = a[..., :4]
    if layout == "yolox":
        grids, steps = [], []
        for s in strides:
            gy, gx = np.meshgrid(np.arange(height // s), np.arange(width // s), indexing="ij")
            grids.append(np.stack([gx, gy], -1).reshape(-1, 2))
            steps.append(np.full((len(grids[-1]), 1), float(s)))
        grid, stride = np.concatenate(grids), np.concatenate(steps)
        if len(grid) != a.shape[1]:
            raise ConfigError(f"evaluation.options.strides: strides {list(strides)} give {len(grid)} anchors at "
                              f"{width}x{height}, the output holds {a.shape[1]}")
        boxes = np.concatenate([(boxes[..., :2] + grid) * stride, np.exp(boxes[..., 2:4]) * stride], -1)
    return boxes, score, best


def class_scores(out: np.ndarray, layout: str) -> np.ndarray:
    """Each anchor's score for each class (images, anchors, classes), as ``decode`` scores the best: the class
    scores; for ``yolov5`` and ``yolox``, objectness x class."""
    a = np.asarray(out, np.float64)
    if layout in ("yolov8", "yolov8_anchors_first"):
        return (a.transpose(0, 2, 1) if layout == "yolov8" else a)[..., 4:]
    return a[..., 4:5] * a[..., 5:]


def fidelity(fp: tuple, q: tuple, floor: float) -> np.ndarray:
    """(score noise, score signal, box noise, box signal) of one image where a box is or nearly is: ``fp`` and
    ``q`` are (boxes cx cy w h per anchor, ``class_scores`` per anchor), and each (anchor, class) that either
    network scores at least ``floor`` is compared.  The score terms are sum((s_fp - s_int8)^2) and sum(s_fp^2); the
    box terms, the sum of the squared x1 y1 x2 y2 differences and of (w^2 + h^2) / 2 of FP32's boxes (the squared
    half-extents of its four coordinates)."""
    a, c = np.nonzero(np.maximum(fp[1], q[1]) >= floor)
    if not len(a):
        return np.zeros(4)
    sf, sq = fp[1][a, c], q[1][a, c]
    bf, bq = xyxy(fp[0][a]), xyxy(q[0][a])
    return np.asarray([np.sum((sf - sq) ** 2), np.sum(sf ** 2), np.sum((bf - bq) ** 2),
                       np.sum(fp[0][a, 2] ** 2 + fp[0][a, 3] ** 2) / 2])


def label_file(image: Path) -> Path | None:
    """The YOLO-format label file of ``image``: ``<image>.txt`` beside it, or the Ultralytics layout's
    ``.../labels/<image>.txt`` for ``.../images/<image>``."""
    image = Path(image)
    candidates = [image.with_suffix(".txt")]
    if "images" in image.parts[:-1]:
        k = len(image.parts) - 1 - image.parts[:-1][::-1].index("images") - 1
        candidates.append(Path(*image.parts[:k], "labels", *image.parts[k + 1:]).with_suffix(".txt"))
    return next((c for c in candidates if c.is_file()), None)


def read_labels(path: Path, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """(boxes x1 y1 x2 y2 in pixels, classes) of a YOLO-format label file (normalized ``class cx cy w h`` lines,
    or ``class x1 y1 x2 y2 ...`` polygons, taken as their bounding boxes)."""
    boxes, classes = [], []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        v = line.split()
        if not v:
            continue
        try:
            c, xs = int(float(v[0])), np.asarray([float(x) for x in v[1:]])
        except ValueError:
            raise DataError(f"{path}:{n}: not a YOLO label line (class cx cy w h, normalized): {line.strip()!r}") from None
        if len(xs) == 4:
            box = xyxy(xs)
        elif len(xs) >= 6 and len(xs) % 2 == 0:
            box = np.concatenate([xs.reshape(-1, 2).min(0), xs.reshape(-1, 2).max(0)])
        else:
            raise DataError(f"{path}:{n}: not a YOLO label line (class cx cy w h, normalized): {line.strip()!r}")
        boxes.append(box * [width, height, width, height])
        classes.append(c)
    return np.asarray(boxes, np.float64).reshape(-1, 4), np.asarray(classes, int)


def _detections(boxes, scores, classes, o: DetectionOptions):
    keep = scores >= o.score_threshold
    b, s, c = xyxy(boxes[keep]), scores[keep], classes[keep]
    k = nms(b, s, c, o.nms_iou, o.max_detections)
    return b[k], s[k], c[k]


class Detection:
    """The task metric (``task.py``'s class form)."""
    limits = {"min": {"f1": 0.9}, "max": {"map50_drop": 0.01}}
    records_per_image = True   # batch() returns one record per image; summarize() takes any list of them
    outcome = "boxes"          # what changed() counts

    @staticmethod
    def changed(record: dict) -> int:
        """The detections INT8 changes in one image: FP32's it misses and its own FP32 does not have."""
        return record["fp32"] + record["int8"] - 2 * record["matched"]

    def __init__(self, **options):
        try:
            check_options(options)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        self.o = DetectionOptions(**options)

    def batch(self, fp32: dict, int8: dict, batch) -> list[dict]:
        """Per image: the detection counts, the matches, the scores' and boxes' ``fidelity`` where a box is or
        nearly is, and for the mAP each detection's class, score and hit against the image's labels."""
        name = self.o.output or next(iter(fp32))
        if name not in fp32:
            raise ConfigError(f"evaluation.options.output: the network has no output {name!r} "
                              f"(its outputs: {', '.join(fp32)})")
        height, width = batch.images.shape[1:3]
        layout = _layout(self.o, name, np.shape(fp32[name]))
        f = decode(fp32[name], layout, height, width, self.o.strides)
        q = decode(int8[name], layout, height, width, self.o.strides)
        f_all, q_all = class_scores(fp32[name], layout), class_scores(int8[name], layout)
        records = []
        for i, path in enumerate(batch.paths):
            fb, fs, fc = _detections(f[0][i], f[1][i], f[2][i], self.o)
            qb, qs, qc = _detections(q[0][i], q[1][i], q[2][i], self.o)
            r = {"fp32": len(fb), "int8": len(qb), "matched": int(match(fb, fc, qb, qc, qs, self.o.match_iou).sum()),
                 "fidelity": fidelity((f[0][i], f_all[i]), (q[0][i], q_all[i]), self.o.score_threshold * BAND)}
            if self.o.labels:
                found = label_file(path)
                gb, gc = read_labels(found, width, height) if found else (np.zeros((0, 4)), np.zeros(0, int))
                r.update(labelled=found is not None, objects=gc,
                         fp32_hits=(fc, fs, match(gb, gc, fb, fc, fs, 0.5)),
                         int8_hits=(qc, qs, match(gb, gc, qb, qc, qs, 0.5)))
            records.append(r)
        return records

    def summarize(self, records: list) -> dict:
        """The numbers over per-image records (any list of them: a bootstrap draw repeats some): sums of counts."""
        images = records
        nf, nq, m = (sum(r[k] for r in images) for k in ("fp32", "int8", "matched"))
        numbers = {"f1": 2 * m / (nf + nq) if nf + nq else None, "precision": m / nq if nq else None,
                   "recall": m / nf if nf else None, "fp32_detections": nf, "int8_detections": nq, "matched": m}
        labelled = sum(1 for r in images if r.get("labelled"))
        if labelled:
            objects = np.concatenate([r["objects"] for r in images])
            maps = {}
            for which in ("fp32", "int8"):
                cls, scores, hits = (np.concatenate([r[f"{which}_hits"][k] for r in images]) for k in range(3))
                aps = [average_precision(hits[cls == c], scores[cls == c], int(np.sum(objects == c)))
                       for c in np.unique(objects)]
                maps[which] = float(np.mean(aps)) if aps else None
            numbers.update(map50_fp32=maps["fp32"], map50_int8=maps["int8"],
                           map50_drop=None if maps["fp32"] is None else maps["fp32"] - maps["int8"],
                           labelled_images=labelled, objects=int(len(objects)))
        return numbers

    def steering(self, records: list) -> dict | None:
        """What the fallback steers by (module docstring): the lesser of the scores' and the boxes' SQNR where a
        box is or nearly is, over the images of ``records``; None where no network scores any anchor near the
        threshold."""
        sums = np.sum([r["fidelity"] for r in records], 0) if records else np.zeros(4)
        if sums[1] <= 0:
            return None
        return least_sqnr({"scores near the threshold": sums[:2], "boxes near the threshold": sums[2:]})
