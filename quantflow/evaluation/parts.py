"""Parts of network outputs: what the gate compares INT8 with FP32 on, and the parts ``quantflow init`` proposes.

A detector often puts quantities of very different scale into one output (Ultralytics' [1, 4 + classes, N]:
box coordinates in pixels, then class scores in 0..1).  The cosine over the whole tensor is then the boxes'
cosine, and the scores can be lost unseen.  ``evaluation.parts`` names slices of an output along one axis, each
compared (cosine, SQNR) and gated on its own (``Region``).

- ``parse_slice``: ``"0:4"``, ``"4:"``, ``":-1"`` or ``"5"`` -> (start, stop), as Python slices read;
- ``regions``: the configured parts resolved against the network's output shapes (errors name the field), plus
  every output as a whole;
- ``head_layout`` / ``propose_parts`` / ``parts_toml``: the usual YOLO head layouts recognised from output shapes,
  and the ``[evaluation.parts]`` table proposed for them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError


def parse_slice(text: str) -> tuple[int | None, int | None]:
    """``"a:b"`` (either end may be left out, negative counts from the end) or ``"k"`` (the one index k) ->
    (start, stop) of a Python slice; ValueError for anything else."""
    t = str(text).strip()
    try:
        if ":" not in t:
            k = int(t)
            return k, (k + 1 if k != -1 else None)
        a, sep, b = t.partition(":")
        if ":" in b:
            raise ValueError
        return (int(a) if a.strip() else None), (int(b) if b.strip() else None)
    except ValueError:
        raise ValueError(f'must be "start:stop" (either may be left out, e.g. "0:4" or "4:") or one index, '
                         f"got {text!r}") from None


@dataclass(frozen=True)
class Region:
    """A network output, whole (``axis`` None) or a part of it: elements ``start:stop`` along ``axis``."""
    label: str                    # what the report calls it: the part's name, or the output's
    output: str                   # the network output it is taken from
    shape: tuple[int, ...]        # its shape (the output's batch first)
    axis: int | None = None
    start: int = 0
    stop: int = 0
    part: str | None = None       # the part's name (evaluation.parts), None for a whole output
    min_cosine: float | None = None   # the gate's limits; None: shown, not gated
    min_sqnr_db: float | None = None
    gate: bool = True             # False (evaluation.parts.<name>.gate): its limits reported, never failing

    @property
    def gated(self) -> bool:
        return self.gate and (self.min_cosine is not None or self.min_sqnr_db is not None)

    @property
    def where(self) -> str:
        """The part as an index expression, e.g. ``[:, 4:22]``; empty for a whole output."""
        if self.axis is None:
            return ""
        return "[" + ", ".join([":"] * self.axis + [f"{self.start}:{self.stop}"]) + "]"

    @property
    def index(self) -> tuple:
        """This region's index into its output's batch array (``()`` for a whole output)."""
        return (slice(None),) * self.axis + (slice(self.start, self.stop),) if self.axis is not None else ()

    def take(self, batch: np.ndarray, n: int) -> np.ndarray:
        """This region of ``batch`` (the output for ``n`` images), one row per image.  A part needs the images
        first (the output's axis 0); a whole output is only cut into ``n`` equal rows."""
        batch = np.asarray(batch)
        if self.axis is not None:
            if len(batch) != n:
                raise ConfigError(f"evaluation.parts.{self.part}: output {self.output} does not hold the images "
                                  f"along its first axis ({len(batch)} rows for {n} images); parts need it")
            batch = batch[self.index]
        return batch.reshape(n, -1)


def regions(parts: dict, outputs: list[tuple[str, tuple]], whole_min_cosine: float | None,
            min_cosine: float = 0.99) -> list[Region]:
    """Every network output (``outputs``: (name, shape) in order) as a whole region, gated at
    ``whole_min_cosine`` unless it is None or the output is split into parts, followed by the parts of it
    ``parts`` names (``evaluation.parts``: name -> part settings), each gated at its own ``min_cosine`` /
    ``min_sqnr_db`` (with neither: at ``min_cosine``), or with ``gate = false`` reported only.  A part that
    does not fit the network is a ConfigError naming its field."""
    shapes = dict(outputs)
    names = ", ".join(f"{n} {list(s)}" for n, s in outputs)
    resolved: list[Region] = []
    for name, p in parts.items():
        field = f"evaluation.parts.{name}"
        if p.output is None and len(outputs) != 1:
            raise ConfigError(f"{field}.output: the network has {len(outputs)} outputs ({names}); name the one "
                              f"this part is taken from")
        output = p.output if p.output is not None else outputs[0][0]
        if output not in shapes:
            raise ConfigError(f"{field}.output: the network has no output {output!r} (its outputs: {names})")
        shape = tuple(shapes[output])
        rank = len(shape)
        if not (-rank < p.axis < rank) or p.axis % rank == 0:
            raise ConfigError(f"{field}.axis: {p.axis} is not an axis of output {output} {list(shape)} other than "
                              f"the batch axis 0 (give 1..{rank - 1} or -1..-{rank - 1})")
        axis = p.axis % rank
        start, stop = parse_slice(p.slice)
        lo, hi, _ = slice(start, stop).indices(shape[axis])
        if hi <= lo:
            raise ConfigError(f"{field}.slice: {p.slice!r} selects nothing of axis {axis} of output {output} "
                              f"{list(shape)} (size {shape[axis]})")
        part_shape = shape[:axis] + (hi - lo,) + shape[axis + 1:]
        limit = p.min_cosine if p.min_cosine is not None else (min_cosine if p.min_sqnr_db is None else None)
        resolved.append(Region(name, output, part_shape, axis, lo, hi, name, limit, p.min_sqnr_db, p.gate))
    split = {r.output for r in resolved if r.gate}   # judged by its gated parts (none gated: whole)
    taken = {n for n, _ in outputs} & {r.label for r in resolved}
    if taken:
        raise ConfigError(f"evaluation.parts: part name(s) {', '.join(sorted(taken))} are the network's output "
                          f"names; name the parts otherwise")
    out = []
    for name, shape in outputs:
        out.append(Region(name, name, tuple(shape), min_cosine=None if name in split else whole_min_cosine))
        out.extend(r for r in resolved if r.output == name)
    return out


# ---------------------------------------------------------------------------------------------- head layouts
# Ultralytics YOLOv8 / v11 (ultralytics/nn/modules/head.py, Detect: cat(dbox, cls.sigmoid()) on dim 1):
# [batch, 4 + classes, anchors], boxes as cx, cy, w, h in input pixels.  YOLOv5 / v7 (models/yolo.py, Detect in
# export mode: cat(z, 1)) and YOLOX (yolox/models/yolo_head.py: cat(reg, obj.sigmoid(), cls.sigmoid()), anchors
# last-but-one): [batch, anchors, 5 + classes], boxes, objectness, class scores.
def finest(regions: list) -> list:
    """Each output once, at the finest the gate looks at it: its parts where ``evaluation.parts`` names any,
    else the output whole.  What a figure that must not let one region hide another is taken over (the
    retraining's distillation loss, the recovery's guard)."""
    split = {r.output for r in regions if r.part}
    return [r for r in regions if r.part or r.output not in split]


def head_layout(shape) -> str | None:
    """``"yolov8"`` ([batch, 4 + classes, anchors]), ``"yolov5"`` ([batch, anchors, 5 + classes]: YOLOv5, v7,
    YOLOX) or None, for an output of ``shape`` (None for a dimension not fixed in the model file)."""
    if len(shape) != 3:
        return None
    _, a, b = shape
    if a is not None and a >= 5 and (b is None or b > a):
        return "yolov8"
    if b is not None and b >= 6 and (a is None or a > b):
        return "yolov5"
    return None


def propose_parts(outputs: list[tuple[str, list]]) -> dict[str, dict]:
    """The ``evaluation.parts`` proposed for a network's outputs (``outputs``: (name, shape), a dimension not fixed
    in the model file as None): {part name: {"output", "axis", "slice", "what"}} for the usual detector heads,
    {} when no known layout fits.

    - YOLOv8 / v11 detect, [batch, 4 + classes, anchors]: boxes 0:4 and scores 4: along axis 1; with a second,
      4-D output of k prototype masks (YOLOv8/11-seg, [batch, k, h, w]) the last k rows are mask coefficients;
    - YOLOv5 / v7 / YOLOX, [batch, anchors, 5 + classes]: boxes 0:4, objectness 4:5, scores 5: along axis 2;
    - YOLOv5's raw heads, [batch, anchors, h, w, 5 + classes] (one output per stride): the same along the last
      axis of each, the part names prefixed with the output's name."""
    three = [(n, s) for n, s in outputs if head_layout(s)]
    if len(outputs) in (1, 2) and three and outputs[0] == three[0]:
        name, shape = three[0]
        if head_layout(shape) == "yolov8":
            masks = outputs[1][1][1] if len(outputs) == 2 and len(outputs[1][1]) == 4 else None
            if len(outputs) == 2 and (masks is None or shape[1] - 4 - masks < 1):
                return {}
            end = f"{shape[1] - masks}" if masks else ""
            parts = {"boxes": {"output": name, "axis": 1, "slice": "0:4", "what": "cx, cy, w, h (pixels)"},
                     "scores": {"output": name, "axis": 1, "slice": f"4:{end}", "what": "class scores"}}
            if masks:
                parts["masks"] = {"output": name, "axis": 1, "slice": f"{end}:", "what": "mask coefficients"}
            return parts
        if len(outputs) == 1:
            return {"boxes": {"output": name, "axis": 2, "slice": "0:4", "what": "cx, cy, w, h"},
                    "objectness": {"output": name, "axis": 2, "slice": "4:5", "what": "objectness"},
                    "scores": {"output": name, "axis": 2, "slice": "5:", "what": "class scores"}}
        return {}
    if outputs and all(len(s) == 5 and s[-1] is not None and s[-1] >= 6 for _, s in outputs):
        parts = {}
        for name, _ in outputs:
            key = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
            parts.update({f"{key}_boxes": {"output": name, "axis": 4, "slice": "0:4", "what": "box"},
                          f"{key}_objectness": {"output": name, "axis": 4, "slice": "4:5", "what": "objectness"},
                          f"{key}_scores": {"output": name, "axis": 4, "slice": "5:", "what": "class scores"}})
        return parts
    return {}


def parts_toml(parts: dict[str, dict], min_cosine: float = 0.99, gate: bool = True) -> str:
    """``propose_parts``' result as the ``[evaluation.parts]`` table of a quantflow.toml ("" for none): each part
    gated at ``min_cosine``, or with ``gate`` False reported only (beside a task metric)."""
    if not parts:
        return ""
    lines = ["[evaluation.parts]   # each part of an output compared and gated on its own (README: Gates for every head)"
             if gate else "[evaluation.parts]   # each part of an output compared on its own and reported; the "
                          "task metric gates"]
    for name, p in parts.items():
        limit = f"min_cosine = {min_cosine:g}" if gate else "gate = false"
        lines.append(f'{name} = {{ output = {json.dumps(p["output"])}, axis = {p["axis"]}, slice = "{p["slice"]}", '
                     f'{limit} }}   # {p["what"]}')
    return "\n".join(lines)


def label(row: dict) -> str:
    """What the report and a failure call a row of the outputs' figures: the part's name, or the output's."""
    return row["part"] or row["output"]
