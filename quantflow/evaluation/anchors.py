"""The shipped task metric for anchor-based detection heads (``evaluation.metric = "anchor_detection"``: SSD,
MediaPipe's BlazeFace / BlazePalm / pose detector, RetinaFace-style heads; ``task.py`` holds the task-metric
protocol).

Such a head returns, per anchor, box regressors ([images, anchors, 4 + extra]: the box, then keypoints or nothing;
``options.boxes``) and class logits or scores ([images, anchors, classes] or [images, anchors]; [images, classes,
anchors] with ``options.class_axis = 1``, as PaddleDetection writes them; ``options.scores``); the network's user
applies the score activation, decodes the boxes against the anchors and suppresses overlaps.  A detector cut
before its suppression (``model.outputs``: PaddleDetection's PicoDet and PP-YOLOE exports) returns its boxes
decoded already, x1 y1 x2 y2 (``options.box_coder = "corners"``).  The metric reads both networks the same way:

- **scores** after the head's activation (``options.activation``: ``"sigmoid"`` on logits, as MediaPipe's and TF's
  SSD; ``"softmax"`` over the classes, as RetinaFace and Caffe's SSD; ``"none"`` when the network applies it),
  the logits first clipped to +-``options.clip`` where set (MediaPipe's ``score_clipping_thresh``, 100); the
  column ``options.background`` (0; -1: none) dropped where there are two or more; each anchor's best class and
  its score;
- **boxes** decoded as MediaPipe's ``TensorsToDetectionsCalculator`` decodes them, from the regressors'
  first four columns (``options.box_order`` ``"xywh"``, or TF's ``"yxhw"``) with ``options.box_scale`` (sx, sy,
  sw, sh): cx = tx / sx * wa + xa, cy = ty / sy * ha + ya, and w = tw / sw * wa, h = th / sh * ha (``box_coder``
  ``"linear"``, MediaPipe's detectors) or w = exp(tw / sw) * wa, h = exp(th / sh) * ha (``"exp"``: SSD's
  center-size coder and RetinaFace's, whose variances 0.1, 0.2 are the scales 10, 10, 5, 5); normalized to the
  input, then in input pixels; with ``"corners"`` the first four columns are the box's corners as the network
  computed them (no anchors).

The anchors (``options.anchors``):

- ``"mediapipe"``: MediaPipe's ``SsdAnchorsCalculator`` with ``fixed_anchor_size`` (every anchor w = h = 1, the
  face, palm and pose detectors' setting): the layers' ``options.anchor_strides`` (consecutive equal strides share
  one grid, as MediaPipe merges them), ``options.anchors_per_cell`` per layer and cell (its aspect ratios plus the
  interpolated scale: 2 for BlazeFace), centres at (x + ``anchor_offset``) / grid width, row-major.  Each
  network's detections are then its anchors at or above ``options.score_threshold``, greedy class-wise NMS at
  ``options.nms_iou`` (0.3, MediaPipe's ``min_suppression_threshold``; MediaPipe blends overlapping boxes where
  this keeps the best, the same reading on both sides), at most ``options.max_detections``, matched as the ``detection`` metric matches them: an INT8
  detection to a free FP32 one of its class at IoU >= ``options.match_iou``, highest INT8 score first;
- boxes decoded by the network (``box_coder = "corners"``): as with MediaPipe's anchors, each network's detections
  are its anchors at or above the threshold, suppressed class by class and matched, whatever ``options.anchors``;
- ``"index"`` (anchors not known from the file: SSD's and RetinaFace's priors come from their training configs):
  FP32 and INT8 share the anchors, so a detection is an anchor at or above the score threshold, and FP32's and
  INT8's are matched per anchor: the same anchor above it in both, with the same class, its two boxes decoded
  against a unit anchor overlapping at IoU >= ``match_iou``.  IoU does not change when both boxes are moved and
  scaled along each axis alike, so that IoU is the decoded boxes' for any anchor.  There is no NMS (it needs the
  anchors), so every anchor counts: F1 here is stricter than on the suppressed detections.

The numbers: ``f1`` = 2 matched / (FP32 + INT8 detections), ``precision``, ``recall`` (INT8 against FP32), the
counts.  Default limit ``f1`` >= 0.9 (as ``detection``'s).  ``changed(record)``: FP32's detections INT8 misses
plus INT8's that FP32 does not have.

What the fallback steers by (``steering``): ``detection.Detection.steering``'s figure -- at each anchor and class
that either network scores at least half the threshold (``detection.BAND``), the scores after the activation and
the decoded boxes (x1 y1 x2 y2 error relative to FP32's half-extents), the lesser SQNR.  Logits far below the
threshold (BlazeFace's background anchors reach -436) are left out, as they cannot change a detection.
"""
from __future__ import annotations

import math
from typing import Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError
from .detection import BAND, fidelity, iou, match, xyxy
from .detection import _detections as detections   # threshold, class-wise NMS: as detection reads YOLO heads
from .options import read_options
from .shipped import per_image
from .steering import least_sqnr

MIN_ANCHORS = 64   # fewer per-anchor rows than this is not read as an anchor head
# MediaPipe's detectors' SsdAnchorsCalculator settings (strides per layer, anchors per layer and cell): BlazeFace
# short range (128) and its back-camera model (256), BlazePalm (192), the pose detector (224), full-range BlazeFace
MEDIAPIPE_ANCHORS = (((8, 16, 16, 16), 2), ((16, 32, 32, 32), 2), ((8, 16, 32, 32, 32), 2), ((4,), 1))
MEDIAPIPE_CLIP = 100.0   # MediaPipe's score_clipping_thresh in those graphs
SSD_SCALE = (10.0, 10.0, 5.0, 5.0)   # SSD's center-size coder; RetinaFace's variances 0.1, 0.2


class AnchorOptions(BaseModel):
    """``evaluation.options`` of ``evaluation.metric = "anchor_detection"``."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    scores: Optional[str] = Field(default=None, description="the output of per-anchor class logits or scores "
                                                            "(default: found from the shapes, pick_outputs)")
    boxes: Optional[str] = Field(default=None, description="the output of per-anchor box regressors")
    activation: Literal["sigmoid", "softmax", "none"] = "sigmoid"
    clip: Optional[float] = Field(default=None, gt=0.0, description="logits clipped to +-clip before the activation")
    background: int = Field(default=0, ge=-1, description="the background class column, dropped where there are "
                                                          "two or more (-1: none)")
    score_threshold: float = Field(default=0.5, gt=0.0, lt=1.0)
    nms_iou: float = Field(default=0.3, gt=0.0, le=1.0)
    match_iou: float = Field(default=0.5, gt=0.0, le=1.0)
    max_detections: int = Field(default=100, gt=0)
    box_coder: Literal["linear", "exp", "corners"] = "linear"
    class_axis: Literal[1, 2] = Field(default=2, description="the scores' axis of the classes: 2 for [images, "
                                                             "anchors, classes], 1 for [images, classes, anchors]")
    box_order: Literal["xywh", "yxhw"] = "xywh"
    box_scale: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)
    anchors: Literal["index", "mediapipe"] = "index"
    anchor_strides: tuple[int, ...] = Field(default=(), description="anchors mediapipe: each layer's stride")
    anchors_per_cell: int = Field(default=2, gt=0, description="anchors mediapipe: per layer and cell")
    anchor_offset: float = Field(default=0.5, ge=0.0, le=1.0)


# ------------------------------------------------------------------------------------------------ the head
def _columns(shape, class_axis: int = 2) -> int | None:
    """The columns per anchor of an output [n, anchors, k] (k) or [n, anchors] (1) -- [n, k, anchors] with
    ``class_axis`` 1 --; None for other shapes."""
    return int(shape[class_axis]) if len(shape) == 3 else 1 if len(shape) == 2 else None


def classes_first(shapes: dict[str, list[int]]) -> tuple[str, str] | None:
    """(boxes, scores) of two outputs [n, anchors, 4] and [n, classes, anchors] (classes fewer than the anchors, at
    least ``MIN_ANCHORS`` of them): PaddleDetection's boxes and scores before its suppression; else None."""
    if len(shapes) != 2 or any(len(s) != 3 for s in shapes.values()):
        return None
    for boxes, scores in (tuple(shapes), tuple(shapes)[::-1]):
        b, c = shapes[boxes], shapes[scores]
        if b[2] == 4 and b[1] >= MIN_ANCHORS and c[0] == b[0] and c[2] == b[1] and c[1] < b[1]:
            return boxes, scores
    return None


def pick_outputs(shapes: dict[str, list[int]]) -> tuple[str, str, list[str]] | None:
    """(boxes, scores, the others) among outputs (name -> shape) that are all [n, anchors, k] or [n, anchors] with
    the same n and anchors (at least ``MIN_ANCHORS``): the boxes are the one output of 4 columns, else the widest of
    4 + an even number (a box and keypoints); the scores the narrowest of the rest; the others (RetinaFace's
    landmarks) must hold an even number of columns.  Also the two outputs ``classes_first`` finds.  None where they
    are not such a head."""
    first = classes_first(shapes)
    if first is not None:
        return first[0], first[1], []
    if not 2 <= len(shapes) <= 3 or any(_columns(s) is None for s in shapes.values()):
        return None
    if len({(s[0], s[1]) for s in shapes.values()}) != 1 or next(iter(shapes.values()))[1] < MIN_ANCHORS:
        return None
    cols = {k: _columns(s) for k, s in shapes.items()}
    four = [k for k, c in cols.items() if c == 4]
    wide = sorted((k for k, c in cols.items() if c > 4 and (c - 4) % 2 == 0), key=cols.get)
    boxes = four[0] if len(four) == 1 else wide[-1] if wide and not four else None
    if boxes is None:
        return None
    rest = sorted((k for k in cols if k != boxes), key=cols.get)
    scores, others = rest[0], rest[1:]
    if cols[boxes] > 4 and cols[scores] >= cols[boxes] or any(cols[k] % 2 for k in others):
        return None
    return boxes, scores, others


def mediapipe_anchors(height: int, width: int, strides, per_cell: int, offset: float = 0.5) -> np.ndarray:
    """Anchors (cx, cy, w, h normalized to the input) of MediaPipe's ``SsdAnchorsCalculator`` with
    ``fixed_anchor_size`` (w = h = 1): per run of equal consecutive ``strides`` one grid of ceil(size / stride)
    cells, ``per_cell`` anchors per layer of the run at each cell, row by row."""
    out, k = [], 0
    while k < len(strides):
        run = next((j for j in range(k, len(strides)) if strides[j] != strides[k]), len(strides)) - k
        gh, gw = math.ceil(height / strides[k]), math.ceil(width / strides[k])
        y, x = np.meshgrid((np.arange(gh) + offset) / gh, (np.arange(gw) + offset) / gw, indexing="ij")
        centres = np.repeat(np.stack([x.reshape(-1), y.reshape(-1)], 1), run * per_cell, 0)
        out.append(np.concatenate([centres, np.ones_like(centres)], 1))
        k += run
    return np.concatenate(out) if out else np.zeros((0, 4))


def mediapipe_setting(anchors: int, height: int, width: int) -> tuple[tuple[int, ...], int] | None:
    """The ``MEDIAPIPE_ANCHORS`` setting (strides, anchors per layer and cell) giving ``anchors`` at the input
    size, if one does."""
    return next(((s, p) for s, p in MEDIAPIPE_ANCHORS if len(mediapipe_anchors(height, width, s, p)) == anchors),
                None)


# ------------------------------------------------------------------------------------------------ reading
def class_scores(out: np.ndarray, o: AnchorOptions) -> np.ndarray:
    """Each anchor's score per class (images, anchors, classes) after the activation, the background dropped."""
    a = np.asarray(out, np.float64)
    a = a[..., None] if a.ndim == 2 else a.swapaxes(1, 2) if o.class_axis == 1 else a
    if o.activation != "none" and o.clip is not None:
        a = np.clip(a, -o.clip, o.clip)
    if o.activation == "sigmoid":
        a = 0.5 * (1.0 + np.tanh(a / 2))   # the sigmoid, without exp's overflow on logits below -709
    elif o.activation == "softmax":
        e = np.exp(a - a.max(-1, keepdims=True))
        a = e / e.sum(-1, keepdims=True)
    if a.shape[-1] >= 2 and o.background >= 0:
        a = np.delete(a, o.background, -1)
    return a


def decode(raw: np.ndarray, anchors: np.ndarray, o: AnchorOptions, height: int, width: int) -> np.ndarray:
    """Boxes cx, cy, w, h in input pixels (images, anchors, 4) from the regressors' first four columns and the
    anchors (cx, cy, w, h normalized), as the module docstring says."""
    r = np.asarray(raw, np.float64)[..., :4]
    if o.box_coder == "corners":   # x1 y1 x2 y2 as the network computed them
        return np.concatenate([(r[..., :2] + r[..., 2:]) / 2, r[..., 2:] - r[..., :2]], -1)
    if o.box_order == "yxhw":
        r = r[..., [1, 0, 3, 2]]
    r = r / np.asarray(o.box_scale)
    centre = r[..., :2] * anchors[:, 2:] + anchors[:, :2]
    size = (np.exp(r[..., 2:]) if o.box_coder == "exp" else r[..., 2:]) * anchors[:, 2:]
    return np.concatenate([centre, size], -1) * [width, height, width, height]


def per_anchor(f_boxes, f_scores, q_boxes, q_scores, threshold: float, match_iou: float) -> tuple[int, int, int]:
    """(FP32 detections, INT8 detections, matched) of one image read per anchor: an anchor whose best class
    scores at least ``threshold`` is a detection; a match is the same anchor detected by both with the same class
    and boxes at IoU >= ``match_iou``."""
    fc, qc = f_scores.argmax(-1), q_scores.argmax(-1)
    fd, qd = f_scores.max(-1) >= threshold, q_scores.max(-1) >= threshold
    both = np.nonzero(fd & qd & (fc == qc))[0]
    overlap = np.diag(iou(xyxy(f_boxes[both]), xyxy(q_boxes[both]))) if len(both) else np.zeros(0)
    return int(fd.sum()), int(qd.sum()), int(np.sum(overlap >= match_iou))


class AnchorDetection:
    """The task metric (``task.py``'s class form, one record per image)."""
    records_per_image = True
    limits = {"min": {"f1": 0.9}}
    outcome = "boxes"   # what changed() counts

    def __init__(self, **options):
        self.o = read_options(AnchorOptions, options, "anchor_detection")
        if self.o.anchors == "mediapipe" and not self.o.anchor_strides:
            raise ConfigError("evaluation.options.anchor_strides: anchors = \"mediapipe\" needs the strides of the "
                              "anchor layers (the strides of MediaPipe's SsdAnchorsCalculator, e.g. [8, 16, 16, 16])")

    def changed(self, record: dict) -> float:
        """The detections INT8 changes in one image: FP32's it misses and its own FP32 does not have."""
        return float(record["fp32"] + record["int8"] - 2 * record["matched"])

    def _outputs(self, fp32: dict) -> tuple[str, str]:
        shapes = {k: list(np.shape(v)) for k, v in fp32.items()}
        found = (self.o.boxes, self.o.scores)
        if None in found:
            found = pick_outputs(shapes)
            if found is None:
                shown = ", ".join(f"{k} {s}" for k, s in shapes.items())
                raise ConfigError(f"evaluation.options.scores / boxes: the outputs ({shown}) are not one output of box "
                                  f"regressors and one of scores per anchor: name them")
        boxes, scores = self.o.boxes or found[0], self.o.scores or found[1]
        for field, name in (("boxes", boxes), ("scores", scores)):
            if name not in fp32:
                raise ConfigError(f"evaluation.options.{field}: the network has no output {name!r} "
                                  f"(its outputs: {', '.join(fp32)})")
        b, s = shapes[boxes], shapes[scores]
        anchors_of = (s[0], s[2]) if self.o.class_axis == 1 and len(s) == 3 else tuple(s[:2])
        if len(b) != 3 or b[2] < 4 or _columns(s, self.o.class_axis) is None or anchors_of != tuple(b[:2]):
            layout = "[images, classes, anchors]" if self.o.class_axis == 1 else "[images, anchors, classes]"
            raise ConfigError(f"evaluation.options.boxes / scores: output {boxes} {b} and output {scores} {s} are not "
                              f"[images, anchors, 4 + extra] regressors and {layout} scores of the same anchors "
                              f"(evaluation.options.class_axis {self.o.class_axis})")
        k = _columns(s, self.o.class_axis)
        if self.o.activation == "softmax" and k < 2:
            raise ConfigError(f"evaluation.options.activation: softmax over output {scores} {s}, which has one "
                              f"column; use \"sigmoid\"")
        if k >= 2 and self.o.background >= k:
            raise ConfigError(f"evaluation.options.background: class {self.o.background}, but output {scores} {s} "
                              f"has {k} columns")
        return boxes, scores

    def _anchors(self, count: int, height: int, width: int) -> np.ndarray:
        if self.o.anchors == "index":
            return np.tile([0.0, 0.0, 1.0, 1.0], (count, 1))
        a = mediapipe_anchors(height, width, self.o.anchor_strides, self.o.anchors_per_cell, self.o.anchor_offset)
        if len(a) != count:
            raise ConfigError(f"evaluation.options.anchor_strides: strides {list(self.o.anchor_strides)} with "
                              f"{self.o.anchors_per_cell} anchor(s) per cell give {len(a)} anchors at {width}x{height}, "
                              f"the output holds {count}")
        return a

    def batch(self, fp32: dict, int8: dict, batch) -> list[dict]:
        """Per image: the detection counts, the matches, and ``detection.fidelity`` of the scores and boxes where
        a box is or nearly is."""
        boxes, scores = self._outputs(fp32)
        height, width = batch.images.shape[1:3]
        anchors = self._anchors(np.shape(fp32[boxes])[1], height, width)
        fb, qb = (decode(x[boxes], anchors, self.o, height, width) for x in (fp32, int8))
        fs, qs = (class_scores(x[scores], self.o) for x in (fp32, int8))
        records = []
        for i in range(len(batch.paths)):
            if self.o.anchors == "index" and self.o.box_coder != "corners":
                nf, nq, m = per_anchor(fb[i], fs[i], qb[i], qs[i], self.o.score_threshold, self.o.match_iou)
            else:
                f_b, _, f_c = detections(fb[i], fs[i].max(-1), fs[i].argmax(-1), self.o)
                q_b, q_s, q_c = detections(qb[i], qs[i].max(-1), qs[i].argmax(-1), self.o)
                nf, nq, m = len(f_b), len(q_b), int(match(f_b, f_c, q_b, q_c, q_s, self.o.match_iou).sum())
            records.append({"fp32": nf, "int8": nq, "matched": m,
                            "fidelity": fidelity((fb[i], fs[i]), (qb[i], qs[i]), self.o.score_threshold * BAND)})
        return records

    def summarize(self, records: list) -> dict:
        records = per_image(records)
        nf, nq, m = (sum(r[k] for r in records) for k in ("fp32", "int8", "matched"))
        return {"f1": 2 * m / (nf + nq) if nf + nq else None, "precision": m / nq if nq else None,
                "recall": m / nf if nf else None, "fp32_detections": nf, "int8_detections": nq, "matched": m}

    def steering(self, records: list) -> dict | None:
        """The lesser of the scores' and the boxes' SQNR where a box is or nearly is (module docstring); None where
        no network scores any anchor near the threshold."""
        sums = np.sum([r["fidelity"] for r in per_image(records)], 0) if records else np.zeros(4)
        if sums[1] <= 0:
            return None
        return least_sqnr({"scores near the threshold": sums[:2], "boxes near the threshold": sums[2:]})
