"""Ops that move, select or replicate values without arithmetic (exact in any precision)."""
from __future__ import annotations

import numpy as np

from .common import as_ints, norm_axis
from .registry import OpDef, register


def _i64(b, values, hint="ints"):
    return b.const(np.array(values, np.int64), hint)


# ----------------------------------------------------------------------------- Concat

def _concat_from_mindir(ctx):
    names = ctx.tensors(0)
    rank = len(ctx.shape(names[0]))
    return names, {"axis": norm_axis(int(ctx.get(1, "axis", 0)), rank)}


register(OpDef("Concat", _concat_from_mindir,
               lambda n, b: b.add("Concat", n.inputs, n.outputs[0], axis=n.attrs["axis"])))


# ----------------------------------------------------------------------------- Split / Unstack

def _split_from_mindir(ctx):
    x = ctx.tensor(0)
    shape = ctx.shape(x)
    axis = norm_axis(int(ctx.get(1, "axis", 0)), len(shape))
    n = int(ctx.get(2, "output_num", 1))
    if shape[axis] % n:
        ctx.fail(f"Split of size {shape[axis]} into {n} equal parts")
    return [x], {"axis": axis, "sizes": [shape[axis] // n] * n}


def _split_onnx(node, b):
    a = node.attrs
    b.add("Split", [node.inputs[0], _i64(b, a["sizes"], "split")], list(node.outputs), axis=a["axis"])


register(OpDef("Split", _split_from_mindir, _split_onnx, num_outputs=lambda a: len(a["sizes"])))


def _unstack_from_mindir(ctx):
    x = ctx.tensor(0)
    shape = ctx.shape(x)
    axis = norm_axis(int(ctx.get(1, "axis", 0)), len(shape))
    return [x], {"axis": axis, "num": shape[axis]}


def _unstack_onnx(node, b):
    a = node.attrs
    parts = b.add("Split", [node.inputs[0], _i64(b, [1] * a["num"], "split")],
                  [b.fresh("part") for _ in range(a["num"])], axis=a["axis"])
    for part, out in zip(parts, node.outputs):
        b.add("Squeeze", [part, _i64(b, [a["axis"]], "axes")], out)


register(OpDef("Unstack", _unstack_from_mindir, _unstack_onnx, num_outputs=lambda a: a["num"]))


# ----------------------------------------------------------------------------- StridedSlice

def _bits(mask: int, i: int) -> bool:
    return bool((int(mask) >> i) & 1)


def _slice_from_mindir(ctx):
    x = ctx.tensor(0)
    shape = ctx.shape(x)
    begin, end, strides = (as_ints(ctx.get(i, k, ())) for i, k in ((1, "begin"), (2, "end"), (3, "strides")))
    bm, em, ellipsis, new_axis, shrink = (int(ctx.get(i, k, 0)) for i, k in (
        (4, "begin_mask"), (5, "end_mask"), (6, "ellipsis_mask"), (7, "new_axis_mask"), (8, "shrink_axis_mask")))
    if ellipsis or new_axis:
        ctx.fail("StridedSlice with ellipsis_mask or new_axis_mask")
    starts, ends, axes, steps, squeeze = [], [], [], [], []
    for i, (s, e, st) in enumerate(zip(begin, end, strides)):
        if _bits(shrink, i):
            s = s + shape[i] if s < 0 else s
            e, st = s + 1, 1
            squeeze.append(i)
        if _bits(bm, i):
            s = 0 if st > 0 else shape[i] - 1
        if _bits(em, i):
            e = shape[i] if st > 0 else -(2 ** 62)
        starts.append(s), ends.append(e), axes.append(i), steps.append(st)
    return [x], {"starts": starts, "ends": ends, "axes": axes, "steps": steps, "squeeze": squeeze}


def _slice_onnx(node, b):
    a = node.attrs
    args = [node.inputs[0]] + [_i64(b, a[k], k) for k in ("starts", "ends", "axes", "steps")]
    if not a["squeeze"]:
        b.add("Slice", args, node.outputs[0])
        return
    b.add("Squeeze", [b.add("Slice", args), _i64(b, a["squeeze"], "axes")], node.outputs[0])


register(OpDef("StridedSlice", _slice_from_mindir, _slice_onnx))


# ----------------------------------------------------------------------------- shape changes

def _static_shape(ctx):
    """The output shape MindSpore inferred (the IR is static; every shape is known at export)."""
    return [ctx.tensor(0)], {"shape": list(ctx.out_shape(0))}


def _reshape_onnx(node, b):
    b.add("Reshape", [node.inputs[0], _i64(b, node.attrs["shape"], "shape")], node.outputs[0])


for _name in ("Reshape", "Flatten", "Squeeze", "ExpandDims"):
    register(OpDef(_name, _static_shape, _reshape_onnx))


def _transpose_from_mindir(ctx):
    return [ctx.tensor(0)], {"perm": as_ints(ctx.get(1, "perm", ()))}


register(OpDef("Transpose", _transpose_from_mindir,
               lambda n, b: b.add("Transpose", n.inputs, n.outputs[0], perm=n.attrs["perm"])))


def _broadcast_onnx(node, b):
    b.add("Expand", [node.inputs[0], _i64(b, node.attrs["shape"], "shape")], node.outputs[0])


register(OpDef("BroadcastTo", _static_shape, _broadcast_onnx))


# ----------------------------------------------------------------------------- Pad

def _pad_from_mindir(ctx):
    x = ctx.tensor(0)
    rank = len(ctx.shape(x))
    paddings = np.asarray(ctx.get(1, "paddings", ()), np.int64).reshape(-1, 2)
    mode = str(ctx.get(2, "mode", "constant")).lower()
    value = ctx.get(3, "constant_value", 0.0)
    if mode not in ("constant", "0"):
        ctx.fail(f"Pad mode {mode!r} (only constant padding is supported)")
    if len(paddings) != rank:
        ctx.fail(f"Pad with {len(paddings)} pairs for a rank-{rank} tensor")
    return [x], {"pads": [int(p) for p in paddings[:, 0]] + [int(p) for p in paddings[:, 1]],
                 "value": float(value or 0.0)}


def _pad_onnx(node, b):
    a = node.attrs
    b.add("Pad", [node.inputs[0], _i64(b, a["pads"], "pads"), b.const(np.float32(a["value"]), "value")],
          node.outputs[0], mode="constant")


register(OpDef("Pad", _pad_from_mindir, _pad_onnx))


# ----------------------------------------------------------------------------- Resize

def _resize_from_mindir(mode: str):
    def parse(ctx):
        align = bool(ctx.get(2, "align_corners", False))
        half = bool(ctx.get(3, "half_pixel_centers", False))
        coord = "align_corners" if align else ("half_pixel" if half else "asymmetric")
        return [ctx.tensor(0)], {"size": list(ctx.out_shape(0)), "mode": mode, "coord": coord}
    return parse


def _resize_onnx(node, b):
    a = node.attrs
    extra = {"nearest_mode": "round_prefer_ceil" if a["coord"] == "align_corners" else "floor"} \
        if a["mode"] == "nearest" else {}
    b.add("Resize", [node.inputs[0], "", "", _i64(b, a["size"], "sizes")], node.outputs[0], mode=a["mode"],
          coordinate_transformation_mode=a["coord"], **extra)


register(OpDef("ResizeNearestNeighbor", _resize_from_mindir("nearest"), _resize_onnx))
register(OpDef("ResizeNearestNeighborV2", _resize_from_mindir("nearest"), _resize_onnx))
register(OpDef("ResizeBilinear", _resize_from_mindir("linear"), _resize_onnx, exact_in_fp16=False))
register(OpDef("ResizeBilinearV2", _resize_from_mindir("linear"), _resize_onnx, exact_in_fp16=False))
