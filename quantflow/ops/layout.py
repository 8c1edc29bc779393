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


def _concat_ms(node, w):
    parts = ", ".join(w.x(node, i) for i in range(len(node.inputs)))
    return f"{w.prim('ops.Concat(%d)' % node.attrs['axis'])}(({parts},))"


register(OpDef("Concat", _concat_from_mindir,
               lambda n, b: b.add("Concat", n.inputs, n.outputs[0], axis=n.attrs["axis"]), to_mindspore=_concat_ms))


# ----------------------------------------------------------------------------- Stack / Tile
# (YOLO heads build their anchor grids with them: mindyolo's make_anchors stacks and tiles aranges)

def _stack_from_mindir(ctx):
    names = ctx.tensors(0)
    rank = len(ctx.shape(names[0])) + 1
    return names, {"axis": norm_axis(int(ctx.get(1, "axis", 0)), rank)}


def _stack_onnx(node, b):
    axes = _i64(b, [node.attrs["axis"]], "axes")
    b.add("Concat", [b.add("Unsqueeze", [x, axes]) for x in node.inputs], node.outputs[0], axis=node.attrs["axis"])


def _stack_ms(node, w):
    parts = ", ".join(w.x(node, i) for i in range(len(node.inputs)))
    return f"{w.prim('ops.Stack(%d)' % node.attrs['axis'])}(({parts},))"


register(OpDef("Stack", _stack_from_mindir, _stack_onnx, to_mindspore=_stack_ms))


def _tile_from_mindir(ctx):
    x = ctx.tensor(0)
    multiples = as_ints(ctx.get(1, "multiples", ()))
    shape = ctx.shape(x)
    if len(multiples) < len(shape):
        ctx.fail(f"Tile with {len(multiples)} multiples of a rank-{len(shape)} input")
    # MindSpore's Tile puts leading 1s on the input's shape up to the multiples' length; ONNX's does not
    lead = len(multiples) - len(shape)
    return [x], {"multiples": multiples, "shape": [1] * lead + list(shape), "lead": lead}


def _tile_onnx(node, b):
    a = node.attrs
    x = node.inputs[0]
    if a.get("lead"):
        x = b.add("Reshape", [x, _i64(b, a["shape"], "shape")])
    b.add("Tile", [x, _i64(b, a["multiples"], "repeats")], node.outputs[0])


def _tile_ms(node, w):
    return f"{w.prim('ops.Tile()')}({w.x(node, 0)}, {tuple(node.attrs['multiples'])})"


register(OpDef("Tile", _tile_from_mindir, _tile_onnx, to_mindspore=_tile_ms))


# ----------------------------------------------------------------------------- TensorScatterUpdate
# (``y[..., 0:2] = v`` in graph mode: YOLOv5's head writes its decoded boxes into the sigmoid output so)

def _scatter_from_mindir(ctx):
    return [ctx.tensor(0), ctx.indices(1), ctx.operand(2)], {}


def _scatter_ms(node, w):
    return f"{w.prim('ops.TensorScatterUpdate()')}({w.x(node, 0)}, {w.x(node, 1)}, {w.x(node, 2)})"


register(OpDef("TensorScatterUpdate", _scatter_from_mindir,
               lambda n, b: b.add("ScatterND", n.inputs, n.outputs[0]), to_mindspore=_scatter_ms))


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


def _split_ms(node, w):
    sizes, axis = node.attrs["sizes"], node.attrs["axis"]
    if len(set(sizes)) == 1:
        return f"{w.prim('ops.Split(%d, %d)' % (axis, len(sizes)))}({w.x(node, 0)})", len(sizes)
    # unequal parts (YOLOv8's DFL split 64 + classes): one slice each (MindSpore's Split makes equal parts)
    x, lead, start, parts = w.x(node, 0), ":, " * axis, 0, []
    for size in sizes:
        parts.append(f"{x}[{lead}{start}:{start + size}]")
        start += size
    return f"({', '.join(parts)},)", len(sizes)


register(OpDef("Split", _split_from_mindir, _split_onnx, num_outputs=lambda a: len(a["sizes"]), to_mindspore=_split_ms))


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


def _unstack_ms(node, w):
    return f"{w.prim('ops.Unstack(%d)' % node.attrs['axis'])}({w.x(node, 0)})", node.attrs["num"]


register(OpDef("Unstack", _unstack_from_mindir, _unstack_onnx, num_outputs=lambda a: a["num"],
               to_mindspore=_unstack_ms))


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


def _slice_ms(node, w):
    a = node.attrs
    items = []
    for s, e, st, axis in zip(a["starts"], a["ends"], a["steps"], a["axes"]):
        if axis in a["squeeze"]:
            items.append(str(s))
        else:
            items.append(f"{s}:{e if abs(e) < 2 ** 31 else ''}:{st}")
    return f"{w.x(node, 0)}[{', '.join(items)}]"


register(OpDef("StridedSlice", _slice_from_mindir, _slice_onnx, to_mindspore=_slice_ms))


# ----------------------------------------------------------------------------- shape changes

def _static_shape(ctx):
    """The output shape MindSpore inferred (the IR is static; every shape is known at export)."""
    return [ctx.tensor(0)], {"shape": list(ctx.out_shape(0))}


def _reshape_onnx(node, b):
    b.add("Reshape", [node.inputs[0], _i64(b, node.attrs["shape"], "shape")], node.outputs[0])


def _reshape_ms(node, w):
    return f"{w.prim('ops.Reshape()')}({w.x(node, 0)}, {tuple(node.attrs['shape'])})"


for _name in ("Reshape", "Flatten", "Squeeze", "ExpandDims"):
    register(OpDef(_name, _static_shape, _reshape_onnx, to_mindspore=_reshape_ms))


def _transpose_from_mindir(ctx):
    return [ctx.tensor(0)], {"perm": as_ints(ctx.get(1, "perm", ()))}


def _transpose_ms(node, w):
    return f"{w.prim('ops.Transpose()')}({w.x(node, 0)}, {tuple(node.attrs['perm'])})"


register(OpDef("Transpose", _transpose_from_mindir,
               lambda n, b: b.add("Transpose", n.inputs, n.outputs[0], perm=n.attrs["perm"]),
               to_mindspore=_transpose_ms))


def _broadcast_onnx(node, b):
    b.add("Expand", [node.inputs[0], _i64(b, node.attrs["shape"], "shape")], node.outputs[0])


def _broadcast_ms(node, w):
    return f"{w.prim('ops.BroadcastTo(%s)' % (tuple(node.attrs['shape']),))}({w.x(node, 0)})"


register(OpDef("BroadcastTo", _static_shape, _broadcast_onnx, to_mindspore=_broadcast_ms))


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


def _padv3_from_mindir(ctx):
    """PadV3 (``ops.pad``): paddings from the last axis backwards, as (begin, end) pairs when
    ``paddings_contiguous`` (the default), else all begins then all ends."""
    x = ctx.tensor(0)
    rank = len(ctx.shape(x))
    flat = as_ints(ctx.get(1, "paddings", ()))
    mode = str(ctx.attr("mode", "constant")).lower()
    if mode != "constant":
        ctx.fail(f"PadV3 mode {mode!r} (only constant padding is supported)")
    if len(flat) % 2 or len(flat) // 2 > rank:
        ctx.fail(f"PadV3 with paddings {flat} for a rank-{rank} tensor")
    k = len(flat) // 2
    pairs = [(flat[2 * i], flat[2 * i + 1]) for i in range(k)] if ctx.attr("paddings_contiguous", True) \
        else [(flat[i], flat[k + i]) for i in range(k)]
    pairs = [(0, 0)] * (rank - k) + pairs[::-1]   # first axis first
    value = np.asarray(ctx.get(2, "constant_value", 0.0), np.float32).reshape(-1)
    return [x], {"pads": [b for b, _ in pairs] + [e for _, e in pairs], "value": float(value[0]) if value.size else 0.0}


def _pad_ms(node, w):
    pads = node.attrs["pads"]
    rank = len(pads) // 2
    pairs = tuple((pads[i], pads[i + rank]) for i in range(rank))
    if node.attrs["value"] == 0.0:
        return f"{w.prim('ops.Pad(%s)' % (pairs,))}({w.x(node, 0)})"
    flat = tuple(p for pair in pairs[::-1] for p in pair)   # ops.pad: last axis first
    return f"ops.pad({w.x(node, 0)}, {flat}, value=float({str(node.attrs['value'])!r}))"


register(OpDef("Pad", _pad_from_mindir, _pad_onnx, to_mindspore=_pad_ms))
register(OpDef("PadV3", _padv3_from_mindir, _pad_onnx, to_mindspore=_pad_ms))


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


def _resize_ms(node, w):
    a = node.attrs
    size = tuple(a["size"][2:])
    align, half = a["coord"] == "align_corners", a["coord"] == "half_pixel"
    if a["mode"] == "nearest":
        return f"{w.prim(f'ops.ResizeNearestNeighbor({size}, align_corners={align})')}({w.x(node, 0)})"
    return f"{w.prim(f'ops.ResizeBilinearV2({align}, {half})')}({w.x(node, 0)}, {size})"


for _name, _mode in (("ResizeNearestNeighbor", "nearest"), ("ResizeNearestNeighborV2", "nearest"),
                     ("ResizeBilinear", "linear"), ("ResizeBilinearV2", "linear")):
    register(OpDef(_name, _resize_from_mindir(_mode), _resize_onnx, exact_in_fp16=_mode == "nearest",
                   to_mindspore=_resize_ms))


# ----------------------------------------------------------------------------- Gather (constant indices)

def _gather_from_mindir(ctx):
    x = ctx.tensor(0)
    rank = len(ctx.shape(x))
    return [x, ctx.indices(1)], {"axis": norm_axis(int(ctx.get(2, "axis", 0)), rank)}


def _gather_ms(node, w):
    return f"{w.prim('ops.Gather()')}({w.x(node, 0)}, {w.x(node, 1)}, {node.attrs['axis']})"


register(OpDef("Gather", _gather_from_mindir,
               lambda n, b: b.add("Gather", n.inputs, n.outputs[0], axis=n.attrs["axis"]), to_mindspore=_gather_ms))


# ----------------------------------------------------------------------------- SpaceToDepth / DepthToSpace
# (YOLOX's Focus stem after onnxruntime's optimizer; pixel shuffle).  MindSpore's, as TensorFlow's, are ONNX's
# SpaceToDepth and DepthToSpace in "DCR" mode; "CRD" (PyTorch's pixel_shuffle) is written as Reshape / Transpose

def _block_from_mindir(ctx):
    if str(ctx.attr("data_format", ctx.attr("format", "NCHW"))).upper() not in ("NCHW", "0"):
        ctx.fail("only NCHW is supported")
    return [ctx.tensor(0)], {"block_size": int(ctx.attr("block_size")), "mode": "DCR"}


def _s2d_onnx(node, b):
    b.add("SpaceToDepth", node.inputs, node.outputs[0], blocksize=node.attrs["block_size"])


def _d2s_onnx(node, b):
    b.add("DepthToSpace", node.inputs, node.outputs[0], blocksize=node.attrs["block_size"], mode=node.attrs["mode"])


def _d2s_ms(node, w):
    k, x = node.attrs["block_size"], w.x(node, 0)
    if node.attrs["mode"] == "DCR":
        return f"{w.prim('ops.DepthToSpace(%d)' % k)}({x})"
    n, c, h, wd = w.graph.tensors[node.outputs[0]].shape
    reshape, transpose = w.prim("ops.Reshape()"), w.prim("ops.Transpose()")
    y = f"{transpose}({reshape}({x}, {(n, c, k, k, h // k, wd // k)}), (0, 1, 4, 2, 5, 3))"
    return f"{reshape}({y}, {(n, c, h, wd)})"


register(OpDef("SpaceToDepth", _block_from_mindir, _s2d_onnx,
               to_mindspore=lambda n, w: f"{w.prim('ops.SpaceToDepth(%d)' % n.attrs['block_size'])}({w.x(n, 0)})"))
register(OpDef("DepthToSpace", _block_from_mindir, _d2s_onnx, to_mindspore=_d2s_ms))
