"""What kind of head a network has, recognised from the shapes AND values of its outputs on a few calibration
images, and the gate ``quantflow init`` proposes for it (``recognise``).

The tests, in order (``input_shape`` N, C, H, W; ``grid`` = the sum over strides 8, 16, 32 of (H/s)(W/s), the
anchor points of a three-stride detector at the input size; also strides 4..32 (-p2) and 8..64 (-p6)):

- one output (N, classes): a **classifier** -> ``top1`` (init asks for per-class folders);
- [N, 4 + classes, grid] (Ultralytics YOLOv8 / v11 detect) -> ``detection``, layout yolov8; with a second, 4-D
  output of k mask prototypes (-seg) the last k rows are mask coefficients, which the detection metric does not
  read: the outputs gate on the parts (boxes, scores, masks);
- [N, 3 * grid, 5 + classes] (YOLOv5 / v7, decoded; alone, or before its raw per-stride heads as mindyolo's
  YOLOv5 returns them) -> ``detection``, layout yolov5, on that output; [N, grid, 5 + classes]
  (YOLOX) -> ``detection``, layout yolox when the box columns are raw grid offsets (all within a few cells, as
  YOLOX's head before ``decode_outputs``) and yolov5 when they are decoded pixels;
- [N, grid, 4 + classes] beside its raw maps [N, 4 x 16 + classes, H/s, W/s] (mindyolo's YOLOv8): anchors first ->
  ``detection``, layout yolov8_anchors_first, on that output;
- one output per stride [N, 3, H/s, W/s, 5 + classes] (YOLOv5's raw heads): the outputs gate on their parts;
- one 3-D output with the images' axis first or second whose rows over the last axis are a softmax (values in
  0..1 summing to 1), or any time-major one [T, N, symbols] (a CRNN's logits): a **CTC sequence** -> ``ctc``;
- two or three outputs [N, anchors, k] (or [N, anchors]) of the same anchors, at least ``anchors.MIN_ANCHORS``
  and not a YOLO grid (``anchors.pick_outputs``: box regressors of 4 or 4 + keypoint columns, scores the
  narrowest of the rest, RetinaFace's landmarks beside): an **anchor-based detector** (SSD, BlazeFace / BlazePalm,
  RetinaFace) -> ``anchor_detection``, the scores' activation from their values (in 0..1: applied by the network;
  else sigmoid, softmax for two columns), class 0 the background where there are two or more; with keypoint
  columns and an anchor count MediaPipe's SSD anchors give at the input size (``anchors.MEDIAPIPE_ANCHORS``), those
  anchors and MediaPipe's box decoding (its score clip on logits), else the anchors by index (SSD's center-size
  coder for 4 columns); boxes the network decoded (x1 <= x2 and y1 <= y2 on every anchor: a detector cut before
  its suppression, ``model.outputs``) are read as corners, suppressed and matched, YOLO grid or not, with no
  background class unless the scores are a softmax; scores [N, classes, anchors] beside boxes [N, anchors, 4]
  (PaddleDetection's) are read with ``class_axis`` 1;
- one output [N, 1, H, W] at the input resolution with every value in 0..1: a **text-region map** (DBNet) ->
  ``text_regions`` -- unless its name says it is a mask (``MASK_WORDS``);
- one output [N, 1, H/s, W/s] or [N, H/s, W/s, 1] (s 1, 2, 4 or 8): a **one-channel mask** -> ``segmentation``
  (``axis`` 3 for the second; ``activation`` sigmoid where the values leave 0..1, logits).  Told from a DB map
  by its layout (channels last), its resolution (below the input's) or its name (at the input resolution);
  [N, 1, H, W] logits at the input resolution not named as a mask stay with the outputs gate;
- one output [N, classes, H/s, W/s] (s 1, 2, 4 or 8, classes >= 2): **segmentation** -> ``segmentation``;
- anything else: the ``outputs`` gate on every output whole.

A YOLO head's parts (``parts.propose_parts``) are proposed with it: gated under the outputs gate, reported as
diagnostics (``gate = false``) beside the detection metric.  The previous test ("[N, a, b] with a >= 5 and b > a
is a YOLOv8 head") took PP-OCRv4 rec's [1, 40, 6625] CTC softmax for one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .anchors import MEDIAPIPE_CLIP, SSD_SCALE, classes_first, mediapipe_setting, pick_outputs
from .parts import propose_parts

STRIDES = (8, 16, 32)
STRIDE_SETS = (STRIDES, (4, 8, 16, 32), (8, 16, 32, 64))   # Ultralytics' P3-P5, -p2 and -p6 heads
SOFTMAX_TOLERANCE = 1e-3    # |row sum - 1| of a float32 softmax over thousands of symbols
RAW_OFFSET_CELLS = 8.0      # YOLOX's raw x, y offsets stay within a few grid cells; decoded ones are pixels
SEGMENTATION_STRIDES = (1, 2, 4, 8)
REG_MAX = 16                # YOLOv8's distribution-focal-loss bins per box side (the raw maps' 4 x 16 channels)
MASK_WORDS = ("mask", "seg", "matte", "alpha", "person", "selfie", "portrait", "foreground")   # in an output's name


@dataclass(frozen=True)
class Head:
    """What ``recognise`` found: the metric to write, its options, the parts, and what it saw."""
    metric: str                       # "top1", "outputs" or a shipped task metric's name (shipped.SHIPPED)
    what: str                         # what was recognised, from what (init's comment)
    options: dict = field(default_factory=dict)
    parts: dict = field(default_factory=dict)   # parts.propose_parts' form


def grid(height: int, width: int, strides=STRIDES) -> int:
    """Anchor points of a detector with ``strides`` at an input of ``height`` x ``width``."""
    return sum(-(-height // s) * -(-width // s) for s in strides)


def _shape(a) -> list[int]:
    return list(np.shape(a))


def _strides(anchors: int, h: int, w: int, per_cell: int = 1) -> tuple[int, ...] | None:
    """The stride set whose grid at ``h`` x ``w`` holds ``anchors`` (``per_cell`` anchors per cell), if any."""
    return next((s for s in STRIDE_SETS if per_cell * grid(h, w, s) == anchors), None)


def _yolo(outputs: list[tuple[str, np.ndarray]], n: int, h: int, w: int) -> Head | None:
    (name, first), rest = outputs[0], outputs[1:]
    s = _shape(first)
    shapes = [(k, _shape(v)) for k, v in outputs]
    strides = _strides(s[2], h, w) if len(s) == 3 else None
    g = grid(h, w, strides) if strides else 0
    at = f"the anchor points of strides {', '.join(map(str, strides or ()))} at {w}x{h}"
    if len(s) == 3 and s[0] == n and strides and s[1] >= 5:
        masks = _shape(rest[0][1])[1] if len(rest) == 1 and len(_shape(rest[0][1])) == 4 else None
        if not rest:
            return Head("detection", f"a YOLOv8/v11 detect head: {name} {s} = [images, 4 + {s[1] - 4} classes, "
                                     f"{g} anchors], {g} = {at}",
                        {"layout": "yolov8"}, propose_parts(shapes))
        if masks is not None and s[1] - 4 - masks >= 1:
            return Head("outputs", f"a YOLOv8/v11-seg head: {name} {s} = [images, 4 + {s[1] - 4 - masks} classes + "
                                   f"{masks} mask coefficients, {g} = {at}] and {masks} mask prototypes "
                                   f"{rest[0][0]} {_shape(rest[0][1])}; the detection metric does not read masks, "
                                   f"so the outputs gate judges each part", parts=propose_parts(shapes))
        return None
    strides = _strides(s[1], h, w) or _strides(s[1], h, w, 3) if len(s) == 3 else None
    g = grid(h, w, strides) if strides else 0
    at = f"the anchor points of strides {', '.join(map(str, strides or ()))} at {w}x{h}"
    raw = [_shape(v) for _, v in rest]
    beside = all(len(r) == 5 and r[0] == n and r[4] == s[-1] for r in raw) and \
        sorted((r[2], r[3]) for r in raw) == sorted((-(-h // st), -(-w // st)) for st in (strides or ())[:len(raw)])
    if len(s) == 3 and s[0] == n and s[2] >= 6 and strides and (not rest or beside):
        box = np.asarray(first[..., :2], np.float64)
        options = {} if strides == STRIDES else {"strides": list(strides)}
        if s[1] == 3 * g:
            kind, layout = f"a YOLOv5/v7 head: {name} {s} = [images, 3 x {g} anchors", "yolov5"
        elif np.abs(box).max() <= RAW_OFFSET_CELLS:
            kind, layout = f"a raw YOLOX head (x, y within {RAW_OFFSET_CELLS:g} cells): {name} {s} = [images, {g} " \
                           f"anchors", "yolox"
        else:
            kind, layout = f"a decoded YOLOX head: {name} {s} = [images, {g} anchors", "yolov5"
        also = f", beside its raw per-stride heads {raw}" if rest else ""
        return Head("detection", f"{kind}, 5 + {s[2] - 5} classes], {g} = {at}{also}",
                    {"layout": layout, **(options if layout == "yolox" else {})}, propose_parts(shapes[:1]))
    dfl = len(s) == 3 and s[0] == n and strides and s[1] == g and s[2] >= 5 and len(raw) == len(strides) and all(
        len(r) == 4 and r[0] == n and r[1] == 4 * REG_MAX + s[2] - 4 for r in raw) and \
        sorted((r[2], r[3]) for r in raw) == sorted((-(-h // st), -(-w // st)) for st in strides)
    if dfl:   # anchors first
        return Head("detection", f"a YOLOv8 head as mindyolo returns it: {name} {s} = [images, {g} anchors, 4 + "
                                 f"{s[2] - 4} classes], {g} = {at}, beside its raw maps {raw} (4 x {REG_MAX} DFL + "
                                 f"classes)", {"layout": "yolov8_anchors_first", "output": name},
                    {"boxes": {"output": name, "axis": 2, "slice": "0:4", "what": "cx, cy, w, h (pixels)"},
                     "scores": {"output": name, "axis": 2, "slice": "4:", "what": "class scores"}})
    fives = [_shape(v) for _, v in outputs]
    if all(len(f) == 5 and f[0] == n and f[4] >= 6 for f in fives) and \
            sorted((f[2], f[3]) for f in fives) == sorted((-(-h // st), -(-w // st)) for st in STRIDES[:len(fives)]):
        return Head("outputs", f"YOLOv5's raw per-stride heads {[f for f in fives]} (grids of strides "
                               f"{list(STRIDES[:len(fives)])} at {w}x{h}); the outputs gate judges each part",
                    parts=propose_parts(shapes))
    return None


def _in_unit(a) -> bool:
    v = np.asarray(a)
    return bool(v.size and v.min() >= 0 and v.max() <= 1)


def _anchor_head(outputs: list[tuple[str, np.ndarray]], n: int, h: int, w: int) -> Head | None:
    shapes = {k: _shape(v) for k, v in outputs}
    found = pick_outputs(shapes)
    if found is None or shapes[found[0]][0] != n:
        return None
    boxes, scores, others = found
    count, kb = shapes[boxes][1], shapes[boxes][-1]
    first = classes_first(shapes) is not None   # scores [images, classes, anchors]
    ks = shapes[scores][1] if first else shapes[scores][2] if len(shapes[scores]) == 3 else 1
    corners = kb == 4 and _corners(dict(outputs)[boxes])
    if not corners and (_strides(count, h, w) or _strides(count, h, w, 3)):   # YOLO boxes and scores split apart
        return None
    values = dict(outputs)[scores]
    activation = "none" if _in_unit(values) else "softmax" if ks == 2 else "sigmoid"
    # class 0 the background where there are two or more, but not among a suppression's sigmoid scores
    background = None if ks < 2 else 0 if activation == "softmax" or not corners else -1
    options = {"boxes": boxes, "scores": scores, "activation": activation,
               **({"background": background} if background is not None else {}),
               **({"class_axis": 1} if first else {})}
    read = {"none": "scores in 0..1 (the network applies its activation)", "softmax": "logits (softmax)",
            "sigmoid": "logits (sigmoid)"}[activation]
    setting = mediapipe_setting(count, h, w) if kb > 4 else None
    if corners:
        options.update(box_coder="corners")
        how = ("boxes decoded by the network (x1 <= x2, y1 <= y2 on every anchor: a detector cut before its "
               "suppression): each network's detections are its anchors at or above the score threshold, suppressed "
               "class by class and matched")
    elif setting:
        strides, per_cell = setting
        options.update(anchors="mediapipe", anchor_strides=list(strides), anchors_per_cell=per_cell,
                       box_scale=[w, h, w, h], **({"clip": MEDIAPIPE_CLIP} if activation == "sigmoid" else {}))
        how = (f"{count} = MediaPipe's SSD anchors of strides {', '.join(map(str, strides))} ({per_cell} per layer "
               f"and cell) at {w}x{h}: boxes decoded against them as MediaPipe does")
    else:
        if kb == 4:
            options.update(box_coder="exp", box_scale=list(SSD_SCALE))
        how = (f"{count} anchors not known from the file: detections matched per anchor"
               + (" (SSD's center-size box coder)" if kb == 4 else ""))
    box = "box x1 y1 x2 y2" if corners else "box" if kb == 4 else f"box 4 + {(kb - 4) // 2} keypoints x 2"
    also = "".join(f", {k} {shapes[k]} beside" for k in others)
    classes = f"{ks} class{'es' if ks > 1 else ''}{', class 0 the background' if background == 0 else ''}"
    layout = f"[images, {classes}, anchors]" if first else f"[images, anchors, {classes}]"
    return Head("anchor_detection", f"an anchor-based detection head: {boxes} {shapes[boxes]} = [images, anchors, "
                                    f"{box}], {scores} {shapes[scores]} = {layout} {read}{also}; {how}", options)


def _corners(boxes) -> bool:
    """Whether every anchor's first four columns read x1 <= x2 and y1 <= y2 (boxes the network decoded): never so
    for thousands of box regressors, which scatter around zero."""
    b = np.asarray(boxes, np.float64)[..., :4]
    return bool(b.size and np.ptp(b) > 0 and np.all(b[..., 2] >= b[..., 0]) and np.all(b[..., 3] >= b[..., 1]))


def _mask(name: str, a: np.ndarray, n: int, h: int, w: int) -> Head | None:
    """A one-channel mask (module docstring), or None."""
    s = _shape(a)
    if len(s) != 4 or s[0] != n:
        return None
    sizes: dict[tuple[int, int], int] = {}
    for k in SEGMENTATION_STRIDES:   # the finest stride first where two give the same size
        sizes.setdefault((-(-h // k), -(-w // k)), k)
    axis = 1 if s[1] == 1 and tuple(s[2:]) in sizes else 3 if s[3] == 1 and tuple(s[1:3]) in sizes else None
    if axis is None:
        return None
    k = sizes[tuple(s[2:] if axis == 1 else s[1:3])]
    named = any(word in name.lower() for word in MASK_WORDS)
    probabilities = _in_unit(a)
    if axis == 1 and k == 1 and not named:
        return Head("text_regions", f"a text-region probability map (DBNet): {name} {s} = [images, 1, H, W] at the "
                                    f"input resolution, every value in 0..1") if probabilities else None
    options = {**({"axis": 3} if axis == 3 else {}), **({} if probabilities else {"activation": "sigmoid"})}
    at = "at the input resolution" if k == 1 else f"at 1/{k} of the input resolution"
    why = "channels last" if axis == 3 else "below the input resolution" if k > 1 else \
        "named as a mask (a map at the input resolution not so named is read as a DB text map)"
    values = "every value in 0..1, foreground above 0.5" if probabilities else \
        "logits, foreground above 0 (0.5 after a sigmoid)"
    return Head("segmentation", f"a one-channel segmentation mask: {name} {s} = [images, "
                                f"{'1, H, W' if axis == 1 else 'H, W, 1'}] {at} ({why}), {values}", options)


def _softmax_rows(a: np.ndarray) -> bool:
    a = np.asarray(a, np.float64)
    return bool(a.size and a.min() >= 0 and a.max() <= 1 + SOFTMAX_TOLERANCE
                and np.abs(a.sum(-1) - 1).max() <= SOFTMAX_TOLERANCE)


def recognise(outputs: dict[str, np.ndarray], input_shape) -> Head:
    """The head of a network whose outputs on a few calibration images (name -> array, in the network's order;
    ``input_shape`` N, C, H, W the batch they were run at) are ``outputs``; see the module docstring."""
    n, _, h, w = (int(d) for d in input_shape)
    items = list(outputs.items())
    shown = ", ".join(f"{k} {_shape(v)}" for k, v in items)
    if not items:
        return Head("outputs", "no outputs")
    if len(items) == 1 and len(_shape(items[0][1])) == 2 and _shape(items[0][1])[0] == n:
        name, a = items[0]
        return Head("top1", f"a classifier: {name} {_shape(a)} = [images, {_shape(a)[1]} classes]")
    yolo = _yolo(items, n, h, w) or _anchor_head(items, n, h, w)
    if yolo is not None:
        return yolo
    if len(items) == 1:
        name, a = items[0]
        s = _shape(a)
        if len(s) == 3 and s[-1] >= 2 and (s[0] == n or s[1] == n):
            layout = "ntc" if s[0] == n else "tnc"
            t = s[1] if layout == "ntc" else s[0]
            if _softmax_rows(a):
                return Head("ctc", f"a CTC sequence recognizer: {name} {s} = [{'images, ' if layout == 'ntc' else ''}"
                                   f"{t} steps, {'images, ' if layout == 'tnc' else ''}{s[-1]} symbols], each step a "
                                   f"softmax over the symbols (its rows sum to 1)", {"layout": layout})
            if layout == "tnc" and s[0] != n:
                return Head("ctc", f"a CTC sequence recognizer: {name} {s} = [{t} steps, images, {s[-1]} symbols], "
                                   f"time-major as a CRNN's logits", {"layout": layout})
        mask = _mask(name, a, n, h, w)
        if mask is not None:
            return mask
        if len(s) == 4 and s[0] == n and s[1] >= 2 and any(s[2:] == [-(-h // k), -(-w // k)]
                                                          for k in SEGMENTATION_STRIDES):
            k = next(k for k in SEGMENTATION_STRIDES if s[2:] == [-(-h // k), -(-w // k)])
            at = "at the input resolution" if k == 1 else f"at 1/{k} of the input resolution"
            return Head("segmentation", f"a segmentation head: {name} {s} = [images, {s[1]} classes, H, W] {at}")
    return Head("outputs", f"no head quantflow has a task metric for ({shown}): INT8 against FP32 on every output")
