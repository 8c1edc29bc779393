"""A deploy graph free in its batch (``build.batch_sizes``), and the check that a batch computes what its images
compute one at a time.

The graph IR is static: every lowering (``engine.lowering``) is written for ``model.input_shape``, whose batch
size ``N`` may sit in constants (a Reshape's target, a Slice's end, an Expand's shape, a Resize's sizes, a
recurrent layer's initial state).  ``free_batch`` follows the batch axis from the input through the ONNX graph and
rewrites each such constant where an exact batch-free form exists: a Reshape's batch entry becomes 0 (the input's
own batch dimension, at the same axis) or -1 (the one entry that scales with the batch: the others hold one
sample's dimensions), a Slice over the whole batch runs to the end, an Expand's batch entry becomes 1, a Resize's
sizes become the same integer scales, an all-zero initial state is dropped (ONNX's default is zeros).  Every input's
batch dimension (a network's other inputs, ``model.inputs``, hold the images on their first axis too) and each
output's become the dim_param ``batch``; an output computed from no input (a constant output) keeps its shape.
Where the batch cannot be followed exactly (an op that mixes samples, a constant shaped by the batch),
``UnsupportedNetworkError`` names the node.

``batch_check`` runs a batch-free emulation at the largest configured batch and each image alone: the device runs
the samples of a batch independently, so the outputs must agree bit for bit.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ..engine.onnx_builder import graph_inputs
from ..errors import UnsupportedNetworkError

BATCH_DIM = "batch"
_TO_END = np.iinfo(np.int64).max

# ops that run each sample alone with the batch on axis 0, their other inputs weights (not broadcast)
_PER_SAMPLE = {"Conv", "ConvTranspose", "ConvInteger", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool",
               "GlobalMaxPool", "GlobalLpPool", "BatchNormalization", "InstanceNormalization", "LRN", "AscendQuant",
               "AscendDequant", "DepthToSpace", "SpaceToDepth", "QLinearConv"}
# ops along one axis (attribute ``axis``): the batch must not be that axis
_ALONG_AXIS = {"Concat", "Split", "Softmax", "LogSoftmax", "Hardmax", "LpNormalization", "Gather", "CumSum"}
_REDUCE = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin"}
# ops whose result depends on the batch as a whole
_MIXING = {"Shape", "Size", "NonZero", "Einsum", "ScatterND", "ScatterElements", "GatherElements", "GatherND",
           "TopK", "NonMaxSuppression", "Loop", "If", "Scan", "Compress", "OneHot", "Range", "ConstantOfShape"}
_RECURRENT = {"LSTM": (5, 6), "GRU": (5,), "RNN": (5,)}   # op -> its initial-state inputs


class _Tracker:
    """The batch axis of every tensor computed from the input: ``(axis, own)``; own: that axis is the batch (size N
    in the static graph); not own: the batch is merged into axis 0 with whole samples (N x m rows)."""

    def __init__(self, model: onnx.ModelProto, what: str):
        self.m, self.what = model, what
        self.inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.shapes = _static_shapes(model)
        inputs = graph_inputs(model)
        self.n = self.shapes[inputs[0].name][0]
        self.state: dict[str, tuple[int, bool]] = {i.name: (0, True) for i in inputs}
        self._fresh = 0

    def fail(self, node, why: str):
        raise UnsupportedNetworkError(
            f"{self.what}: node {node.name!r} ({node.op_type}) {why}, so the graph cannot run at a free batch size; "
            f"build.batch_sizes cannot be used with this network (leave it empty for one static batch)")

    def const(self, node, k: int) -> np.ndarray:
        name = node.input[k] if k < len(node.input) else ""
        if name not in self.inits:
            self.fail(node, f"reads its input {k} ({name!r}) computed at run time where quantflow expects a constant")
        return self.inits[name]

    def replace(self, node, k: int, value: np.ndarray) -> None:
        """Input ``k`` of ``node`` becomes a new initializer (the old one may have other readers)."""
        self._fresh += 1
        name = f"{node.input[k]}__batch_free{self._fresh}"
        self.m.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        self.inits[name] = np.asarray(value)
        node.input[k] = name

    def rank(self, name: str) -> int:
        return len(self.shapes[name])

    def run(self) -> None:
        for node in self.m.graph.node:
            carried = [i for i in node.input if i in self.state]
            if not carried:
                continue
            if node.op_type in _MIXING:
                self.fail(node, "computes from the whole batch")
            out = _HANDLERS.get(node.op_type, _elementwise)(self, node, self.state[carried[0]], carried)
            if out is not None:   # else the handler set each output's own
                self.state.update((o, out) for o in node.output if o)


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Every tensor's static shape, from onnx's shape inference (AscendQuant / AscendDequant keep their input's)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.value_info[:]
    for n in probe.graph.node:
        if n.op_type in ("AscendQuant", "AscendDequant"):
            n.op_type = "Identity"
            del n.input[1:]
            del n.attribute[:]
    inferred = onnx.shape_inference.infer_shapes(probe, check_type=False, strict_mode=False)
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    g = inferred.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[vi.name] = tuple(d.dim_value for d in t.shape.dim)
    return shapes


def _shape(t: _Tracker, node, name: str) -> tuple[int, ...]:
    if name not in t.shapes:
        t.fail(node, f"has no static shape for {name!r}")
    return t.shapes[name]


def _elementwise(t: _Tracker, node, st, carried) -> tuple[int, bool]:
    """Broadcast from the right: every other input holds the batch on the same output axis, or has size 1 there."""
    out_rank = len(_shape(t, node, node.output[0]))
    axis = None
    for i in node.input:
        if not i:
            continue
        r = len(_shape(t, node, i))
        if i in t.state:
            a, own = t.state[i]
            if axis is not None and (a + out_rank - r, own) != axis:
                t.fail(node, "reads the batch on different axes of its inputs")
            axis = (a + out_rank - r, own)
    for i in node.input:
        if i and i not in t.state:
            shape, p = t.shapes[i], axis[0] - (out_rank - len(t.shapes[i]))
            if 0 <= p < len(shape) and shape[p] != 1:
                t.fail(node, f"broadcasts {i!r} of shape {list(shape)}, which spans the batch axis")
    return axis


def _per_sample(t: _Tracker, node, st, carried):
    if carried != [node.input[0]] or st[0] != 0:
        t.fail(node, "does not hold the batch on axis 0 of its first input")
    return st


def _pad(t, node, st, carried):
    pads, r, a = t.const(node, 1), t.rank(node.input[0]), st[0]
    if carried != [node.input[0]] or pads[a] or pads[a + r]:
        t.fail(node, "pads the batch axis")
    return st


def _reshape(t: _Tracker, node, st, carried):
    if carried != [node.input[0]]:
        t.fail(node, "takes its target shape from the batch")
    a, own = st
    src, dst = _shape(t, node, node.input[0]), _shape(t, node, node.output[0])
    before = int(np.prod(src[:a]))
    k = None
    if own:   # the batch axis kept whole: as many elements before it and after it
        after = int(np.prod(src[a + 1:]))
        k = next((j for j in range(len(dst)) if int(np.prod(dst[:j])) == before and dst[j] == t.n
                  and int(np.prod(dst[j + 1:])) == after), None)
    if k is None and before == 1:   # whole samples, one after the other: a batch axis first, else merged into axis 0
        k = next((j for j in range(len(dst)) if int(np.prod(dst[:j])) == 1 and dst[j] == t.n), None)
        own = k is not None
        if k is None and dst[0] % t.n == 0:
            k = 0
    if k is None:
        t.fail(node, f"reshapes {list(src)} to {list(dst)} across the batch axis")
    allowzero = any(x.name == "allowzero" and x.i for x in node.attribute)
    target = list(dst)
    target[k] = 0 if st[1] and own and k == a and not allowzero else -1
    t.replace(node, 1, np.array(target, np.int64))
    return k, own


def _flatten(t, node, st, carried):
    a, _ = st
    src = _shape(t, node, node.input[0])
    axis = next((x.i for x in node.attribute if x.name == "axis"), 1) % max(len(src), 1)
    if a >= axis or int(np.prod(src[:a])) != 1:
        t.fail(node, f"flattens the batch axis {a} into another (axis {axis})")
    return 0, int(np.prod(src[:axis])) == t.n and st[1]


def _transpose(t, node, st, carried):
    a, own = st
    rank = t.rank(node.input[0])
    perm = next((list(x.ints) for x in node.attribute if x.name == "perm"), list(range(rank))[::-1])
    k = perm.index(a)
    if not own and k != 0:
        t.fail(node, "moves whole samples merged into axis 0 off axis 0")
    return k, own


def _axes(t, node, k: int, attr: str = "axes") -> list[int] | None:
    for x in node.attribute:
        if x.name == attr:
            return list(x.ints)
    return [int(v) for v in t.const(node, k).ravel()] if k < len(node.input) and node.input[k] else None


def _squeeze(t, node, st, carried):
    a, own = st
    rank = t.rank(node.input[0])
    axes = [x % rank for x in (_axes(t, node, 1) or [d for d, s in enumerate(_shape(t, node, node.input[0]))
                                                      if s == 1])]
    if a in axes:
        t.fail(node, "squeezes the batch axis")
    return a - sum(1 for x in axes if x < a), own


def _unsqueeze(t, node, st, carried):
    a, own = st
    rank = t.rank(node.input[0]) + len(_axes(t, node, 1))
    axes = {x % rank for x in _axes(t, node, 1)}
    kept = [d for d in range(rank) if d not in axes]
    if not own and kept[a] != 0:
        t.fail(node, "moves whole samples merged into axis 0 off axis 0")
    return kept[a], own


def _slice(t, node, st, carried):
    a, own = st
    if carried != [node.input[0]]:
        t.fail(node, "takes its bounds from the batch")
    rank = t.rank(node.input[0])
    starts, ends = t.const(node, 1), t.const(node, 2)
    axes = _axes(t, node, 3) or list(range(len(starts)))
    steps = t.const(node, 4) if len(node.input) > 4 and node.input[4] else np.ones(len(starts), np.int64)
    for j, ax in enumerate(axes):
        if ax % rank != a:
            continue
        if not (own and starts[j] == 0 and ends[j] >= t.n and steps[j] == 1):
            t.fail(node, "slices part of the batch")
        new = np.array(ends, np.int64)
        new[j] = _TO_END
        t.replace(node, 2, new)
    return st


def _along_axis(t, node, st, carried):
    a, own = st
    rank = t.rank(node.input[0])
    axis = next((x.i for x in node.attribute if x.name == "axis"), 0 if node.op_type in ("Concat", "Gather") else -1)
    if node.op_type == "CumSum":
        axis = int(t.const(node, 1))
    if axis % rank == a or not own and axis % rank == 0:
        t.fail(node, "works along the batch axis")
    if node.op_type == "Gather":
        if carried != [node.input[0]]:
            t.fail(node, "gathers with indices computed from the batch")
        idx_rank = t.rank(node.input[1])
        return (a if axis % rank > a else a - 1 + idx_rank), own
    if node.op_type == "Concat" and len(carried) != len([i for i in node.input if i]):
        t.fail(node, "joins the batch with a constant")
    return st


def _reduce(t, node, st, carried):
    a, own = st
    rank = t.rank(node.input[0])
    if node.op_type in ("ArgMax", "ArgMin"):
        axes = [next((x.i for x in node.attribute if x.name == "axis"), 0)]
    else:
        axes = _axes(t, node, 1)
    if not axes:
        t.fail(node, "reduces every axis, the batch too")
    axes = [x % rank for x in axes]
    keep = next((x.i for x in node.attribute if x.name == "keepdims"), 1)
    if a in axes or not own and 0 in axes:
        t.fail(node, "reduces over the batch axis")
    return (a if keep else a - sum(1 for x in axes if x < a)), own


def _matmul(t, node, st, carried):
    """The batch in A's rows or stack axes; B a constant, or a stack holding the batch on the same axis."""
    a, own = st
    out_rank = t.rank(node.output[0])
    ra, b_shape = t.rank(node.input[0]), _shape(t, node, node.input[1])
    if node.input[0] not in t.state or a >= ra - 1:
        t.fail(node, "contracts over the batch axis")
    k = a + out_rank - ra
    p = k - (out_rank - len(b_shape))   # the batch's place among B's stack axes
    if node.input[1] in t.state:
        if a >= ra - 2 or t.state[node.input[1]] != (p, own):
            t.fail(node, "multiplies by a matrix holding the batch elsewhere")
    elif a < ra - 2 and 0 <= p < len(b_shape) - 2 and b_shape[p] != 1:
        t.fail(node, "broadcasts a matrix stack over the batch axis")
    return k, own


def _gemm(t, node, st, carried):
    trans_a = next((x.i for x in node.attribute if x.name == "transA"), 0)
    if carried != [node.input[0]] or trans_a or st[0] != 0:
        t.fail(node, "does not hold the batch in the rows of its first input")
    if len(node.input) > 2 and node.input[2]:
        c = t.shapes[node.input[2]]
        if len(c) == 2 and c[0] != 1:
            t.fail(node, f"adds a bias of shape {list(c)}, which spans the batch axis")
    return st


def _expand(t, node, st, carried):
    a, own = st
    shape = np.array(t.const(node, 1), np.int64)
    out_rank = max(t.rank(node.input[0]), len(shape))
    k = a + out_rank - t.rank(node.input[0])
    p = k - (out_rank - len(shape))
    if 0 <= p < len(shape) and shape[p] != 1:
        if shape[p] != t.n or not own:
            t.fail(node, "expands the batch axis")
        shape[p] = 1
        t.replace(node, 1, shape)
    return k, own


def _tile(t, node, st, carried):
    if t.const(node, 1)[st[0]] != 1:
        t.fail(node, "repeats the batch")
    return st


def _resize(t, node, st, carried):
    if st[0] != 0 or carried != [node.input[0]]:
        t.fail(node, "does not hold the batch on axis 0")
    src = np.array(_shape(t, node, node.input[0]), np.int64)
    if len(node.input) > 3 and node.input[3]:
        # the same scales onnxruntime derives from the sizes (float32 sizes / input), where they give the sizes back
        sizes = t.const(node, 3)
        scales = np.concatenate([[1.0], np.float32(sizes[1:]) / np.float32(src[1:])]).astype(np.float32)
        if np.any(np.floor(np.float32(src[1:]) * scales[1:]) != sizes[1:]):
            t.fail(node, f"resizes to fixed sizes {list(sizes)} that no scale gives exactly")
        t.replace(node, 2, scales)
        del node.input[3:]
    elif len(node.input) > 2 and node.input[2] and t.const(node, 2)[0] != 1:
        t.fail(node, "scales the batch axis")
    return st


def _recurrent(t, node, st, carried):
    a, own = st
    if carried != [node.input[0]] or a != 1 or not own:
        t.fail(node, "does not hold the batch on axis 1 of its sequence input")
    if len(node.input) > 4 and node.input[4]:
        t.fail(node, "takes per-sample sequence lengths shaped by the batch")
    for k in _RECURRENT[node.op_type]:
        if k < len(node.input) and node.input[k]:
            if np.any(t.const(node, k)):
                t.fail(node, f"starts from a non-zero initial state {node.input[k]!r} shaped by the batch")
            node.input[k] = ""   # ONNX's absent initial state is zeros
    while node.input and not node.input[-1]:
        node.input.pop()
    for j, o in enumerate(node.output):
        if o:
            t.state[o] = (2 if j == 0 else 1, True)   # Y (T, D, B, H); Y_h, Y_c (D, B, H)
    return None


_HANDLERS = {**{op: _per_sample for op in _PER_SAMPLE}, **{op: _along_axis for op in _ALONG_AXIS},
             **{op: _reduce for op in _REDUCE}, **{op: _recurrent for op in _RECURRENT},
             "Reshape": _reshape, "Flatten": _flatten, "Transpose": _transpose, "Squeeze": _squeeze,
             "Unsqueeze": _unsqueeze, "Slice": _slice, "MatMul": _matmul, "Gemm": _gemm, "Expand": _expand,
             "Tile": _tile, "Resize": _resize, "Pad": _pad, "MatMulInteger": _matmul}


def free_batch(model: onnx.ModelProto, what: str, constant_outputs=()) -> onnx.ModelProto:
    """``model`` (a lowering of a static graph IR, any target: the image input first, any other inputs with the
    images on their first axis) with a free batch: the batch constants rewritten (module doc), every input's batch
    dimension and each output's the dim_param ``batch``.  ``constant_outputs``: the outputs computed from no input
    (``Graph.constant_outputs``), which keep their shape.  ``what`` names the graph in errors (e.g. the file).
    Raises UnsupportedNetworkError naming the node (or the output) where no exact batch-free form exists."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    t = _Tracker(m, what)
    t.run()
    for vi in m.graph.output:
        st = t.state.get(vi.name)
        if st is None and vi.name in constant_outputs:
            continue
        if st is None or not st[1]:
            why = "does not depend on the input" if st is None else "holds the batch merged with another axis"
            raise UnsupportedNetworkError(f"{what}: output {vi.name!r} {why}, so the graph cannot run at a free "
                                          f"batch size; build.batch_sizes cannot be used with this network")
        _free_dim(vi, st[0])
    for vi in graph_inputs(m):
        _free_dim(vi, 0)
    del m.graph.value_info[:]
    return m


def _free_dim(vi: onnx.ValueInfoProto, axis: int) -> None:
    dim = vi.type.tensor_type.shape.dim[axis]
    dim.Clear()
    dim.dim_param = BATCH_DIM


def batch_free_axes(model: onnx.ModelProto) -> dict[str, int | None]:
    """Each graph input's and output's free (``batch``) axis, None where it has none."""
    g = model.graph
    return {vi.name: next((k for k, d in enumerate(vi.type.tensor_type.shape.dim) if d.dim_param == BATCH_DIM),
                          None) for vi in list(g.input) + list(g.output)}


# ----------------------------------------------------------------------------- the check

def batch_check(model: onnx.ModelProto, samples: np.ndarray, batch: int, keeps=None,
                fixed: dict[str, np.ndarray] | None = None) -> dict:
    """Run the batch-free runnable ``model`` (the INT8 emulation, or a float graph) on ``batch`` samples at once
    (``samples`` repeated in turn to fill it) and on each of ``samples`` alone; each output's rows must equal the
    alone runs bit for bit (an output with no batch axis, a constant, must equal one alone run's).  ``fixed``: the
    model's other inputs by name, each with one sample's value, fed beside every sample (``Graph.fixed_inputs``).
    Returns {"batch", "images", "identical", "outputs": {name: {"max_abs_diff", "differing"}}, "worst"} (worst: the
    output with the largest difference, None when identical)."""
    from ..data.extra_inputs import batch_of
    from ..engine.runner import session

    sess = session(model, keeps=keeps)
    feed, names = sess.get_inputs()[0], [o.name for o in sess.get_outputs()]
    axes = batch_free_axes(model)
    dtype = np.float16 if feed.type == "tensor(float16)" else np.float32
    samples = np.asarray(samples, dtype)
    types = {i.name: (np.float16 if i.type == "tensor(float16)" else np.float32) for i in sess.get_inputs()}

    def feeds(x):
        return {feed.name: x, **{k: np.ascontiguousarray(batch_of(np.asarray(v), len(x)), types[k])
                                 for k, v in (fixed or {}).items()}}

    alone = [sess.run(names, feeds(samples[i:i + 1])) for i in range(len(samples))]
    order = [i % len(samples) for i in range(batch)]
    together = sess.run(names, feeds(samples[order]))
    outputs, worst = {}, None
    for j, name in enumerate(names):
        axis = axes[name]
        expected = alone[0][j] if axis is None else np.concatenate([alone[i][j] for i in order], axis=axis)
        got = together[j]
        if got.shape != expected.shape:
            raise UnsupportedNetworkError(f"batch check: output {name!r} has shape {list(got.shape)} at batch "
                                          f"{batch}, expected {list(expected.shape)}")
        same = (got == expected) | (np.isnan(got) & np.isnan(expected))
        diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
        largest = float(np.nanmax(np.where(same, 0.0, diff))) if diff.size else 0.0
        outputs[name] = {"max_abs_diff": largest, "differing": int((~same).sum())}
        if outputs[name]["differing"] and (worst is None or largest > outputs[worst]["max_abs_diff"]):
            worst = name
    return {"batch": batch, "images": len(samples), "identical": worst is None, "outputs": outputs, "worst": worst}
