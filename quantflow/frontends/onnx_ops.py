"""ONNX ops -> graph IR nodes: the per-node context (``Ctx``) and one handler per ONNX op type
(``HANDLERS``), used by the ONNX front-end (``onnx_model.py``, whose docstring lists the mappings)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedNetworkError
from ..ir import Node, TensorInfo
from ..ops.common import as_ints, norm_axis, same_pads


@dataclass
class Const:
    """A value known when the model is read; ``name``: its tensor name should an IR op read it."""
    array: np.ndarray
    name: str


def ir_array(arr: np.ndarray) -> np.ndarray:
    """Float tensors are float32 in the IR (the emulator models float16 itself)."""
    arr = np.asarray(arr)
    if arr.dtype.kind == "f" and arr.dtype != np.float32:
        return arr.astype(np.float32)
    return arr


def is_static(dims) -> bool:
    return dims is not None and all(isinstance(d, int) and d > 0 for d in dims)



# ----------------------------------------------------------------------------- per-node context

class Ctx:
    """One ONNX node while it becomes IR nodes."""

    def __init__(self, reader, k: int, n, where: str):
        self.r, self.k, self.n, self.where = reader, k, n, where
        from onnx import helper
        self.attrs = {}
        for a in n.attribute:
            v = helper.get_attribute_value(a)
            self.attrs[a.name] = v.decode() if isinstance(v, bytes) else v

    def fail(self, why: str):
        raise UnsupportedNetworkError(f"{self.where}: {why}")

    def attr(self, key: str, default=None):
        return self.attrs.get(key, default)

    def has(self, i: int) -> bool:
        return i < len(self.n.input) and bool(self.n.input[i])

    def x(self, i: int = 0) -> str:
        """Input ``i`` as an IR tensor."""
        if not self.has(i):
            self.fail(f"input {i} is missing")
        return self.r.tensor(self.n.input[i], self.where)

    def const(self, i: int) -> np.ndarray | None:
        return self.r.const(self.n.input[i]) if self.has(i) else None

    def need_const(self, i: int, what: str) -> np.ndarray:
        v = self.const(i)
        if v is None:
            self.fail(f"input {i} ({what}) is computed at run time; quantflow needs it to be a constant")
        return v

    def shape(self, i: int = 0) -> tuple[int, ...]:
        return self.r.onnx_shape(self.n.input[i], self.where)

    def out_shape(self, j: int = 0) -> tuple[int, ...]:
        return self.r.onnx_shape(self.n.output[j], self.where)

    def out_info(self, j: int = 0) -> TensorInfo:
        return self.r.info(self.n.output[j], self.where)

    def only_first_output(self) -> None:
        if any(self.n.output[1:]):
            self.fail(f"the node has {len([o for o in self.n.output if o])} outputs; quantflow supports only the "
                      f"first (inference)")

    def float_cast(self) -> bool:
        from onnx import TensorProto
        floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
        src = self.r.infos.get(self.n.input[0], [None, None])[1]
        return self.attr("to") in floats and (src in floats or src is None and not isinstance(
            self.r.values.get(self.n.input[0]), Const))

    def dropout_check(self) -> None:
        if self.attr("is_test", 1) == 0 and self.r.opset < 7:
            self.fail("Dropout in training mode")
        if self.has(2):
            mode = self.const(2)
            if mode is None or bool(mode):
                self.fail("Dropout with training_mode (export the network in inference mode)")
        self.only_first_output()

    def const_input(self, i: int, arr: np.ndarray, keep_name: bool) -> str:
        """An initializer for a constant input: the ONNX one where its value is unchanged, else a new one."""
        if keep_name and self.has(i):
            return self.x(i)
        name = self.r.claim(f"v{self.k}:const{i}")
        self.r.initializers[name] = ir_array(arr)
        return name

    def emit(self, op: str, inputs: list[str], attrs: dict, suffix: str = "", infos: list[TensorInfo] | None = None,
             outputs: int = 1, result: int | str | None = 0) -> list[str]:
        """Append an IR node (named ``v<k>`` or ``v<k>_<suffix>``); output ``result`` becomes the ONNX node's first
        output value (None: not the node's result; "all": output j is the ONNX node's output j)."""
        base = f"v{self.k}" + (f"_{suffix}" if suffix else "")
        name = self.r.claim(base)
        outs = [name] if outputs == 1 else [self.r.claim(f"{name}:{i}") for i in range(outputs)]
        infos = infos or [self.out_info()]
        for o, info in zip(outs, infos):
            self.r.tensors[o] = info
        node = Node(name, op, list(inputs), outs, attrs, scope=self.n.name)
        self.r.nodes.append(node)
        for o in outs:
            self.r.producer[o] = node
        if result == "all":
            for o, ir in zip(self.n.output, outs):
                if o:
                    self.r.values[o] = ir
        elif result is not None:
            self.r.values[self.n.output[0]] = outs[result]
        return outs


# ----------------------------------------------------------------------------- op handlers

def _scalar(v) -> float:
    return float(np.asarray(v).reshape(-1)[0])


def _spatial_pads(ctx: Ctx, hw, kernel, strides, dilations) -> list[int]:
    """IR pads [top, left, bottom, right] (ONNX's own order for 2-D: x1_begin, x2_begin, x1_end, x2_end)."""
    mode = ctx.attr("auto_pad", "NOTSET") or "NOTSET"
    if mode == "NOTSET":
        pads = as_ints(ctx.attr("pads", [0, 0, 0, 0]))
        if len(pads) != 4:
            ctx.fail(f"pads {pads} for a 2-D window")
        if min(pads) < 0:
            ctx.fail(f"negative pads {pads}")
        return pads
    if mode == "VALID":
        return [0, 0, 0, 0]
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        (t, b), (l, r) = (same_pads(hw[i], kernel[i], strides[i], dilations[i]) for i in range(2))
        return [t, l, b, r] if mode == "SAME_UPPER" else [b, r, t, l]
    ctx.fail(f"unsupported auto_pad {mode!r}")


def _check_out_hw(ctx: Ctx, hw, kernel, strides, dilations, pads) -> None:
    want = ctx.out_shape()[2:]
    got = tuple((hw[i] + pads[i] + pads[i + 2] - ((kernel[i] - 1) * dilations[i] + 1)) // strides[i] + 1
                for i in range(2))
    if got != tuple(want):
        ctx.fail(f"computed output size {got} differs from ONNX shape inference's {tuple(want)}")


def _conv(ctx: Ctx):
    xs, ws = ctx.shape(0), ctx.shape(1)
    if len(ws) != 4 or len(xs) != 4:
        ctx.fail(f"only 2-D convolutions (NCHW input, 4-D weight) are supported; input {xs}, weight {ws}")
    kernel = as_ints(ctx.attr("kernel_shape", ws[2:]))
    if tuple(kernel) != tuple(ws[2:]):
        ctx.fail(f"kernel_shape {kernel} differs from the weight's {ws[2:]}")
    strides, dilations = as_ints(ctx.attr("strides", [1, 1])), as_ints(ctx.attr("dilations", [1, 1]))
    group = int(ctx.attr("group", 1))
    pads = _spatial_pads(ctx, xs[2:], kernel, strides, dilations)
    _check_out_hw(ctx, xs[2:], kernel, strides, dilations, pads)
    attrs = {"pads": pads, "strides": strides, "dilations": dilations, "group": group}
    if not ctx.has(2):
        ctx.emit("Conv2D", [ctx.x(0), ctx.x(1)], attrs)
        return
    # MindSpore's Conv2d(has_bias=True): Conv2D + BiasAdd; the BiasAdd pass makes the bias the third input
    y = ctx.emit("Conv2D", [ctx.x(0), ctx.x(1)], attrs, result=None)[0]
    if ctx.shape(2) != (ws[0],):
        ctx.fail(f"bias of shape {ctx.shape(2)}, expected ({ws[0]},)")
    ctx.emit("BiasAdd", [y, ctx.x(2)], {"axis": 1, "rank": 4}, suffix="bias")


def _gemm(ctx: Ctx):
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    ta, tb = bool(ctx.attr("transA", 0)), bool(ctx.attr("transB", 0))
    if len(ctx.shape(0)) != 2 or len(ctx.shape(1)) != 2:
        ctx.fail(f"Gemm of shapes {ctx.shape(0)} and {ctx.shape(1)} (ONNX requires 2-D operands)")
    w = ctx.const(1)
    if alpha != 1.0:
        if w is None:
            ctx.fail(f"alpha {alpha} with a weight computed at run time")
        b_in = ctx.const_input(1, (np.float64(alpha) * w.astype(np.float64)).astype(w.dtype), keep_name=False)
    else:
        b_in = ctx.x(1)
    attrs = {"transpose_a": ta, "transpose_b": tb, "rank_a": 2, "rank_b": 2}
    if not ctx.has(2):
        ctx.emit("MatMul", [ctx.x(0), b_in], attrs)
        return
    m, n_out = ctx.out_shape()
    c = ctx.const(2)
    if c is None:
        if beta != 1.0:
            ctx.fail(f"beta {beta} with a bias computed at run time")
        y = ctx.emit("MatMul", [ctx.x(0), b_in], attrs, result=None)[0]
        ctx.emit("Add", [y, ctx.x(2)], {}, suffix="bias")
        return
    scaled = c if beta == 1.0 else (np.float64(beta) * c.astype(np.float64)).astype(c.dtype)
    y = ctx.emit("MatMul", [ctx.x(0), b_in], attrs, result=None)[0]
    if c.size in (1, n_out) and (c.ndim < 2 or c.shape[0] == 1):  # one value per output column: nn.Dense's bias
        vec = np.broadcast_to(scaled.reshape(-1), (n_out,)).copy()
        keep = beta == 1.0 and c.shape == (n_out,)
        ctx.emit("BiasAdd", [y, ctx.const_input(2, vec, keep_name=keep)], {"axis": 1, "rank": 2}, suffix="bias")
    else:
        ctx.emit("Add", [y, ctx.const_input(2, scaled, keep_name=beta == 1.0)], {}, suffix="bias")


def _matmul(ctx: Ctx):
    xs, ws = ctx.shape(0), ctx.shape(1)
    ra, rb = len(xs), len(ws)
    weight = ctx.x(1) if rb == 2 else None
    if rb == 1 and ra >= 2 and ctx.const(1) is not None:
        # (..., K) @ (K,): ONNX promotes the vector to a (K, 1) matrix and drops that column from the result
        # (PaddleDetection's distribution-to-distance integral, softmax over bins @ [0, 1, ..., K-1])
        weight, ws = ctx.const_input(1, ctx.const(1).reshape(-1, 1), keep_name=False), [ws[0], 1]
    elif ra < 2 or rb < 2:
        ctx.fail(f"MatMul with a 1-D operand (shapes {xs}, {ws})")
    attrs = {"transpose_a": False, "transpose_b": False, "rank_a": 2, "rank_b": 2}
    if weight is not None and (ra > 2 or rb == 1):  # a linear layer on (..., K): over rows of K, as nn.Dense
        rows = TensorInfo((int(np.prod(xs[:-1])), xs[-1]), "float32")
        flat = ctx.x(0) if ra == 2 else ctx.emit("Reshape", [ctx.x(0)], {"shape": list(rows.shape)}, suffix="rows",
                                                 infos=[rows], result=None)[0]
        y = ctx.emit("MatMul", [flat, weight], attrs, infos=[TensorInfo((rows.shape[0], ws[1]), "float32")],
                     result=None)[0]
        ctx.emit("Reshape", [y], {"shape": list(ctx.out_shape())}, suffix="unrows")
        return
    op = "MatMul" if ra == rb == 2 else "BatchMatMul"
    ctx.emit(op, [ctx.x(0), ctx.x(1)], {**attrs, "rank_a": ra, "rank_b": rb})


def _batchnorm(ctx: Ctx):
    if int(ctx.attr("training_mode", 0)):
        ctx.fail("BatchNormalization in training mode (export the network in inference mode)")
    if ctx.r.opset < 7 and not int(ctx.attr("is_test", 0)):
        ctx.fail("BatchNormalization in training mode (is_test = 0)")
    if int(ctx.attr("spatial", 1)) == 0:
        ctx.fail("BatchNormalization with spatial = 0 (per-element statistics)")
    ctx.only_first_output()
    xs = ctx.shape(0)
    if len(xs) not in (2, 4):
        ctx.fail(f"BatchNormalization of a rank-{len(xs)} tensor (quantflow: NCHW or NC)")
    c = TensorInfo((xs[1],), "float32")
    ctx.emit("BatchNorm", [ctx.x(i) for i in range(5)], {"epsilon": float(ctx.attr("epsilon", 1e-5))},
             infos=[ctx.out_info(), c, c, c, c], outputs=5)


def _layernorm(ctx: Ctx):
    ctx.only_first_output()
    xs = ctx.shape(0)
    rank = len(xs)
    axis = int(ctx.attr("axis", -1))
    axis = norm_axis(axis, rank)
    norm = tuple(xs[axis:])
    params = []
    for i, what in ((1, "scale"), (2, "bias")):
        c = ctx.const(i) if ctx.has(i) else np.zeros(norm, np.float32)
        if c is None:  # computed at run time: the IR's LayerNorm takes parameters of the normalized shape
            if ctx.shape(i) != norm:
                ctx.fail(f"{what} of shape {ctx.shape(i)} computed at run time, expected {norm}")
            params.append(ctx.x(i))
        else:
            full = np.broadcast_to(c, norm).copy()
            params.append(ctx.const_input(i, full, keep_name=c.shape == norm))
    stats = TensorInfo(tuple(xs[:axis]) + (1,) * (rank - axis), "float32")
    ctx.emit("LayerNorm", [ctx.x(0), *params], {"axis": axis, "rank": rank,
                                                 "epsilon": float(ctx.attr("epsilon", 1e-5))},
             infos=[ctx.out_info(), stats, stats], outputs=3)


def _split(ctx: Ctx):
    xs = ctx.shape(0)
    axis = int(ctx.attr("axis", 0))
    axis = norm_axis(axis, len(xs))
    if ctx.has(1):
        sizes = as_ints(ctx.need_const(1, "split"))
    elif ctx.attr("split") is not None:
        sizes = as_ints(ctx.attr("split"))
    else:
        parts = int(ctx.attr("num_outputs", len(ctx.n.output)))
        size = -(-xs[axis] // parts)
        sizes = [min(size, xs[axis] - j * size) for j in range(parts)]
    if sum(sizes) != xs[axis] or min(sizes) < 1:
        ctx.fail(f"Split of size {xs[axis]} into {sizes}")
    infos = []
    for j, size in enumerate(sizes):
        shape = list(xs)
        shape[axis] = size
        infos.append(TensorInfo(tuple(shape), ctx.out_info(0).dtype))
    ctx.emit("Split", [ctx.x(0)], {"axis": axis, "sizes": sizes}, infos=infos, outputs=len(sizes), result="all")


def _unary(op: str):
    def handler(ctx: Ctx):
        ctx.emit(op, [ctx.x(0)], {})
    return handler


def _clip(ctx: Ctx):
    if ctx.r.opset < 11:
        lo, hi = ctx.attr("min", None), ctx.attr("max", None)
    else:
        lo = _scalar(ctx.need_const(1, "min")) if ctx.has(1) else None
        hi = _scalar(ctx.need_const(2, "max")) if ctx.has(2) else None
    big = float(np.finfo(np.float32).max)
    lo = None if lo is None or lo <= -big else float(lo)
    hi = None if hi is None or hi >= big else float(hi)
    if lo == 0.0 and hi == 6.0:
        ctx.emit("ReLU6", [ctx.x(0)], {})
    elif lo == 0.0 and hi is None:
        ctx.emit("ReLU", [ctx.x(0)], {})
    elif lo is None and hi is None:
        ctx.r.values[ctx.n.output[0]] = ctx.x(0)
    else:  # any other bounds: max(x, lo), then min(., hi) (MindSpore's clip_by_value)
        x = ctx.x(0)
        if lo is not None:
            x = ctx.emit("Maximum", [x, ctx.const_input(1, np.float32(lo), keep_name=False)], {},
                         suffix="min" if hi is not None else "", result=None if hi is not None else 0)[0]
        if hi is not None:
            ctx.emit("Minimum", [x, ctx.const_input(2, np.float32(hi), keep_name=False)], {})


def _hardsigmoid(ctx: Ctx):
    alpha, beta = float(ctx.attr("alpha", 0.2)), float(ctx.attr("beta", 0.5))
    if np.isclose(alpha, 1.0 / 6.0, rtol=1e-6, atol=0) and beta == 0.5:
        ctx.emit("HSigmoid", [ctx.x(0)], {})
    else:  # PaddlePaddle's hardsigmoid: alpha 0.2
        ctx.emit("HardSigmoid", [ctx.x(0)], {"alpha": alpha, "beta": beta})


def _leaky_relu(ctx: Ctx):
    alpha = float(ctx.attr("alpha", 0.01))
    if 0.0 <= alpha <= 1.0:  # max(a x, x), as MindSpore's nn.LeakyReLU writes it
        ax = ctx.emit("Mul", [ctx.x(0), ctx.const_input(1, np.float32(alpha), keep_name=False)], {}, suffix="alpha",
                      result=None)[0]
        ctx.emit("Maximum", [ax, ctx.x(0)], {})
    else:
        ctx.emit("PReLU", [ctx.x(0), ctx.const_input(1, np.array([alpha], np.float32), keep_name=False)],
                 {"rank": len(ctx.shape(0))})


def _channel_slope(slope: np.ndarray, xs: tuple[int, ...]) -> np.ndarray | None:
    """The slope as MindSpore's PReLU holds it (one value, or one per channel of axis 1), or None where the slope,
    broadcast to the input's shape ``xs``, varies along some other axis."""
    if slope.size == 1:
        return slope.reshape(1)
    if len(xs) < 2:
        return None
    channel = np.moveaxis(np.broadcast_to(slope, xs), 1, 0).reshape(xs[1], -1)
    return np.ascontiguousarray(channel[:, 0]) if np.all(channel == channel[:, :1]) else None


def _prelu(ctx: Ctx):
    """PRelu, its slope broadcast to the input as ONNX broadcasts it (from the right; any rank up to the input's,
    e.g. (1, C, 1, 1) for NCHW): MindSpore's PReLU where the slope is one value or one per channel; a slope that
    varies along another axis (over H / W) is written out as max(x, 0) + slope * min(x, 0), which computes
    PRelu's one rounded product in float16 too (the sum adds a zero)."""
    xs, shape, slope = ctx.shape(0), ctx.shape(1), ctx.const(1)
    try:
        fits = len(shape) <= len(xs) and np.broadcast_shapes(shape, xs) == tuple(xs)
    except ValueError:  # not broadcastable at all
        fits = False
    if not fits:
        ctx.fail(f"slope of shape {shape} does not broadcast to the input's {xs} (ONNX: unidirectional "
                 f"broadcasting); re-export with a slope of shape (C,) or (C, 1, 1)")
    weight = None if slope is None else _channel_slope(slope.astype(np.float32), xs)
    if weight is not None:
        ctx.emit("PReLU", [ctx.x(0), ctx.const_input(1, weight, keep_name=weight.shape == slope.shape)],
                 {"rank": len(xs)})
        return
    full = TensorInfo(tuple(xs), "float32")
    zero = ctx.r.claim(f"v{ctx.k}:zero")
    ctx.r.initializers[zero] = np.float32(0.0)
    parts = [ctx.emit(op, [ctx.x(0), zero], {}, suffix=suffix, infos=[full], result=None)[0]
             for op, suffix in (("Maximum", "pos"), ("Minimum", "neg"))]
    scaled = ctx.emit("Mul", [parts[1], ctx.x(1)], {}, suffix="scaled", infos=[full], result=None)[0]
    ctx.emit("Add", [parts[0], scaled], {})


def _pow(ctx: Ctx):
    ins, e = _operands(ctx), ctx.const(1)
    if e is not None and e.dtype.kind != "f":  # an integer exponent in float arithmetic
        ctx.emit("Pow", [ins[0], ctx.const_input(1, e.astype(np.float32), keep_name=False)], {})
    else:
        ctx.emit("Pow", ins, {})


def _variadic(op: str):
    """Max / Min / Sum of any number of tensors: a chain of the binary op."""
    def handler(ctx: Ctx):
        ins = [ctx.x(i) for i in range(len(ctx.n.input)) if ctx.has(i)]
        if len(ins) == 1:
            ctx.r.values[ctx.n.output[0]] = ins[0]
            return
        y = ins[0]
        for j, other in enumerate(ins[1:], 1):
            last = j == len(ins) - 1
            y = ctx.emit(op, [y, other], {}, suffix="" if last else f"part{j}",
                         infos=None if last else [TensorInfo(tuple(np.broadcast_shapes(*(ctx.r.ir_shape(t)
                                                                                        for t in (y, other)))))],
                         result=0 if last else None)[0]
    return handler


def _operands(ctx: Ctx) -> list[str]:
    """The two operands of an elementwise binary op, which the IR broadcasts as ONNX does from opset 7 on (NumPy's
    rule: aligned from the right, any ranks, 1-sized axes).  Opsets 1-6 broadcast B from ``axis`` instead where
    ``broadcast`` is set: read where that is the same alignment, refused otherwise."""
    if ctx.r.opset < 7 and int(ctx.attr("broadcast", 0)):
        ra, rb = len(ctx.shape(0)), len(ctx.shape(1))
        axis = int(ctx.attr("axis", ra - rb))
        if norm_axis(axis, ra) != ra - rb:
            ctx.fail(f"opset-{ctx.r.opset} broadcasting of B {ctx.shape(1)} from axis {axis} of A {ctx.shape(0)} "
                     f"(not aligned from the right, as opset 7 on broadcasts); convert the model to opset 7 or later "
                     f"first: onnx.version_converter.convert_version(model, 13)")
    return [ctx.x(0), ctx.x(1)]


def _mul(ctx: Ctx):
    if ctx.k in ctx.r.silu:
        ctx.emit("SiLU", [ctx.r.tensor(ctx.r.silu[ctx.k], ctx.where)], {})
    else:
        ctx.emit("Mul", _operands(ctx), {})


def _add(ctx: Ctx):
    """Add; a constant per-channel vector added to a Conv2D / 2-D MatMul output is that layer's BiasAdd."""
    ins, out = _operands(ctx), ctx.out_shape()
    for t, c in ((0, 1), (1, 0)):
        arr, src = ctx.const(c), ctx.r.values.get(ctx.n.input[t])
        node = ctx.r.producer.get(src) if isinstance(src, str) else None
        if arr is None or node is None or ctx.shape(t) != out:
            continue
        if node.op == "Conv2D" and len(out) == 4 and arr.ndim in (3, 4) and arr.shape[-3:] == (out[1], 1, 1) \
                and arr.size == out[1]:
            ctx.emit("BiasAdd", [ctx.x(t), ctx.const_input(c, arr.reshape(-1), keep_name=False)],
                     {"axis": 1, "rank": 4})
            return
        if node.op == "MatMul" and len(out) == 2 and arr.size == out[1] and arr.shape in ((out[1],), (1, out[1])):
            ctx.emit("BiasAdd", [ctx.x(t), ctx.const_input(c, arr.reshape(-1), keep_name=arr.ndim == 1)],
                     {"axis": 1, "rank": 2})
            return
    ctx.emit("Add", ins, {})


def _binary(op: str):
    def handler(ctx: Ctx):
        ctx.emit(op, _operands(ctx), {})
    return handler


def _concat(ctx: Ctx):
    rank = len(ctx.out_shape())
    axis = int(ctx.attr("axis", 1 if ctx.r.opset < 4 else 0))
    ctx.emit("Concat", [ctx.x(i) for i in range(len(ctx.n.input)) if ctx.has(i)],
             {"axis": norm_axis(axis, rank)})


def _pool(op: str):
    def handler(ctx: Ctx):
        if len(ctx.n.output) > 1 and ctx.n.output[1]:
            ctx.fail("MaxPool's Indices output is not supported")
        xs = ctx.shape(0)
        if len(xs) != 4:
            ctx.fail(f"only 2-D pooling (NCHW) is supported, input {xs}")
        kernel = as_ints(ctx.attr("kernel_shape"))
        strides = as_ints(ctx.attr("strides", [1, 1]))
        if as_ints(ctx.attr("dilations", [1, 1])) != [1, 1]:
            ctx.fail(f"dilated pooling (dilations {ctx.attr('dilations')})")
        pads = _spatial_pads(ctx, xs[2:], kernel, strides, [1, 1])
        count_pad = op == "AvgPool" and int(ctx.attr("count_include_pad", 0))
        if int(ctx.attr("ceil_mode", 0)):
            if count_pad and any(pads):
                ctx.fail("AveragePool with ceil_mode and count_include_pad")
            out = ctx.out_shape()[2:]
            for i in range(2):  # ceil mode = the extra end padding that completes the last window
                extra = (out[i] - 1) * strides[i] + kernel[i] - (xs[2 + i] + pads[i] + pads[i + 2])
                if (out[i] - 1) * strides[i] >= xs[2 + i] + pads[i]:
                    ctx.fail("ceil_mode with a last window that starts in the padding")
                pads[i + 2] += max(extra, 0)
        _check_out_hw(ctx, xs[2:], kernel, strides, [1, 1], pads)
        x = ctx.x(0)
        if count_pad and any(pads):  # divide by the whole window: pad with zeros first, then a valid pool
            t, l, b, r = pads
            padded = (xs[0], xs[1], xs[2] + t + b, xs[3] + l + r)
            x = ctx.emit("Pad", [x], {"pads": [0, 0, t, l, 0, 0, b, r], "value": 0.0}, suffix="pad",
                         infos=[TensorInfo(padded, "float32")], result=None)[0]
            pads = [0, 0, 0, 0]
        (t, b), (l, r) = (same_pads(xs[2 + i], kernel[i], strides[i]) for i in range(2))
        same = [t, l, b, r]
        mode = "valid" if not any(pads) else ("same" if pads == same else "pad")
        ctx.emit(op, [x], {"kernel": kernel, "strides": strides, "pads": pads, "pad_mode": mode})
    return handler


def _global_pool(op: str):
    def handler(ctx: Ctx):
        xs = ctx.shape(0)
        if len(xs) != 4:
            ctx.fail(f"only 2-D global pooling (NCHW) is supported, input {xs}")
        h, w = xs[2:]
        ctx.emit(op, [ctx.x(0)], {"kernel": [h, w], "strides": [h, w], "pads": [0, 0, 0, 0], "pad_mode": "valid"})
    return handler


def _static_shape(op: str):
    """Flatten / Reshape / Squeeze / Unsqueeze: the IR op with the static output shape."""
    def handler(ctx: Ctx):
        ctx.emit(op, [ctx.x(0)], {"shape": list(_out_shape(ctx, op))})
    return handler


def _out_shape(ctx: Ctx, op: str) -> tuple[int, ...]:
    xs = ctx.shape(0)
    if op == "Flatten":
        axis = int(ctx.attr("axis", 1))
        axis = norm_axis(axis, len(xs))
        shape = (int(np.prod(xs[:axis])), int(np.prod(xs[axis:])))
    elif op == "Reshape":
        spec = as_ints(ctx.need_const(1, "shape") if ctx.r.opset >= 5 else ctx.attr("shape"))
        allow_zero = int(ctx.attr("allowzero", 0))
        dims = [xs[i] if d == 0 and not allow_zero else d for i, d in enumerate(spec)]
        if dims.count(-1) == 1:
            known = int(np.prod([d for d in dims if d != -1]))
            dims[dims.index(-1)] = int(np.prod(xs)) // known if known else 0
        shape = tuple(dims)
    else:
        return ctx.out_shape()
    inferred = ctx.r.infos.get(ctx.n.output[0], [None])[0]
    if is_static(inferred) and tuple(inferred) != shape or int(np.prod(shape)) != int(np.prod(xs)):
        ctx.fail(f"output shape {shape} from input {xs} disagrees with ONNX shape inference ({inferred})")
    return shape


def _transpose(ctx: Ctx):
    rank = len(ctx.shape(0))
    ctx.emit("Transpose", [ctx.x(0)], {"perm": as_ints(ctx.attr("perm", list(range(rank))[::-1]))})


def _softmax(ctx: Ctx):
    rank = len(ctx.shape(0))
    axis = int(ctx.attr("axis", -1 if ctx.r.opset >= 13 else 1))
    axis = norm_axis(axis, rank)
    if ctx.r.opset < 13 and axis != rank - 1 and any(d != 1 for d in ctx.shape(0)[axis + 1:]):
        ctx.fail(f"opset-{ctx.r.opset} Softmax over the flattened axes {axis}..{rank - 1} (the IR's Softmax is over "
                 f"one axis)")
    ctx.emit("Softmax", [ctx.x(0)], {"axis": axis})


def _reduce(op: str):
    def handler(ctx: Ctx):
        rank = len(ctx.shape(0))
        if ctx.has(1):   # an input from opset 13 (ReduceSum) / 18 (the others) on
            axes = as_ints(ctx.need_const(1, "axes"))
        else:
            axes = as_ints(ctx.attr("axes", []))
        if not axes and int(ctx.attr("noop_with_empty_axes", 0)):
            ctx.r.values[ctx.n.output[0]] = ctx.x(0)
            return
        axes = sorted(norm_axis(a, rank) for a in axes) or list(range(rank))
        ctx.emit(op, [ctx.x(0)], {"axes": axes, "keepdims": bool(ctx.attr("keepdims", 1))})
    return handler


def _pad(ctx: Ctx):
    rank = len(ctx.shape(0))
    mode = ctx.attr("mode", "constant")
    if mode != "constant":
        ctx.fail(f"Pad mode {mode!r} (only constant padding is supported)")
    if ctx.r.opset < 11:
        pads, value = as_ints(ctx.attr("pads")), float(ctx.attr("value", 0.0))
    else:
        pads = as_ints(ctx.need_const(1, "pads"))
        value = _scalar(ctx.need_const(2, "constant_value")) if ctx.has(2) else 0.0
        if ctx.has(3):
            axes = [norm_axis(a, rank) for a in as_ints(ctx.need_const(3, "axes"))]
            full = [0] * (2 * rank)
            for j, a in enumerate(axes):
                full[a], full[a + rank] = pads[j], pads[j + len(axes)]
            pads = full
    if min(pads) < 0:
        ctx.fail(f"negative pads {pads} (cropping)")
    ctx.emit("Pad", [ctx.x(0)], {"pads": pads, "value": value})


def _slice(ctx: Ctx):
    shape = ctx.shape(0)
    rank = len(shape)
    if ctx.r.opset < 10:
        starts, ends = as_ints(ctx.attr("starts")), as_ints(ctx.attr("ends"))
        axes = as_ints(ctx.attr("axes", list(range(len(starts)))))
        steps = [1] * len(starts)
    else:
        starts, ends = as_ints(ctx.need_const(1, "starts")), as_ints(ctx.need_const(2, "ends"))
        axes = as_ints(ctx.need_const(3, "axes")) if ctx.has(3) else list(range(len(starts)))
        steps = as_ints(ctx.need_const(4, "steps")) if ctx.has(4) else [1] * len(starts)
    given = {(norm_axis(a, rank)): (s, e, st) for a, s, e, st in zip(axes, starts, ends, steps)}
    if any(st == 0 for _, _, st in given.values()):
        ctx.fail("Slice with step 0")
    # every axis in order (the IR's StridedSlice lists them all), whole for the axes ONNX leaves out
    full = [given.get(a, (0, shape[a], 1)) for a in range(rank)]
    def clamp(v: int) -> int:  # INT64_MAX-style "to the end" stays beyond any dimension, in range of int64
        return max(min(v, 2 ** 62), -(2 ** 62))
    ctx.emit("StridedSlice", [ctx.x(0)], {"starts": [clamp(s) for s, _, _ in full],
                                          "ends": [clamp(e) for _, e, _ in full], "axes": list(range(rank)),
                                          "steps": [st for _, _, st in full], "squeeze": []})


def _resize(ctx: Ctx):
    if ctx.r.opset < 11:
        ctx.fail(f"opset-{ctx.r.opset} Resize (quantflow reads Resize from opset 11)")
    xs, out = ctx.shape(0), ctx.out_shape()
    if len(xs) != 4 or tuple(out[:2]) != tuple(xs[:2]):
        ctx.fail(f"Resize from {xs} to {out}: only the spatial dims of an NCHW tensor may change")
    mode = ctx.attr("mode", "nearest")
    coord = ctx.attr("coordinate_transformation_mode", "half_pixel")
    if int(ctx.attr("antialias", 0)):
        ctx.fail("Resize with antialias")
    if mode == "nearest":
        nearest = ctx.attr("nearest_mode", "round_prefer_floor")
        whole = all(out[i] % xs[i] == 0 for i in (2, 3))
        # at whole upscale factors s these pick source pixel floor(x / s), as asymmetric + floor does: half_pixel
        # puts x at x/s + (1/s - 1)/2 (rounded: never a tie), tf_half_pixel_for_nn at (x + 0.5)/s (floored)
        if whole and (coord in ("half_pixel", "pytorch_half_pixel") and nearest in ("round_prefer_floor",
                                                                                  "round_prefer_ceil")
                      or coord == "tf_half_pixel_for_nn" and nearest == "floor"):
            coord, nearest = "asymmetric", "floor"
        if (coord, nearest) not in (("asymmetric", "floor"), ("align_corners", "round_prefer_ceil")):
            ctx.fail(f"nearest Resize with coordinate_transformation_mode {coord!r} and nearest_mode {nearest!r} "
                     f"(supported: asymmetric + floor, align_corners + round_prefer_ceil, and the half-pixel modes "
                     f"at whole upscale factors)")
        op = "ResizeNearestNeighbor"
    elif mode == "linear":
        if coord == "pytorch_half_pixel" and min(out[2:]) > 1:
            coord = "half_pixel"
        if coord not in ("half_pixel", "align_corners", "asymmetric"):
            ctx.fail(f"linear Resize with coordinate_transformation_mode {coord!r}")
        op = "ResizeBilinear"
    else:
        ctx.fail(f"Resize mode {mode!r} (nearest and linear are supported)")
    ctx.emit(op, [ctx.x(0)], {"size": list(out), "mode": mode, "coord": coord})


def _upsample(ctx: Ctx):
    """Upsample (opsets 7-9): Resize with asymmetric coordinates (nearest: the floor pixel)."""
    xs, out = ctx.shape(0), ctx.out_shape()
    if len(xs) != 4 or tuple(out[:2]) != tuple(xs[:2]):
        ctx.fail(f"Upsample from {xs} to {out}: only the spatial dims of an NCHW tensor may change")
    mode = ctx.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        ctx.fail(f"Upsample mode {mode!r}")
    nearest = mode == "nearest"
    ctx.emit("ResizeNearestNeighbor" if nearest else "ResizeBilinear", [ctx.x(0)],
             {"size": list(out), "mode": "nearest" if nearest else "linear", "coord": "asymmetric"})


def _scatter_nd(ctx: Ctx):
    """ScatterND at constant indices (``y[..., 0:2] = v`` in a PyTorch export: YOLOv5's box decoding)."""
    if ctx.attr("reduction", "none") != "none":
        ctx.fail(f"ScatterND with reduction {ctx.attr('reduction')!r}")
    idx = ctx.need_const(1, "indices").astype(np.int64)
    ctx.emit("TensorScatterUpdate", [ctx.x(0), ctx.const_input(1, idx, keep_name=False), ctx.x(2)], {})


def _instance_norm(ctx: Ctx):
    """InstanceNormalization written out: (x - mean) / sqrt(var + eps) * scale + B over each image's H x W."""
    xs = ctx.shape(0)
    if len(xs) != 4:
        ctx.fail(f"InstanceNormalization of a rank-{len(xs)} tensor (NCHW only)")
    full, stat = TensorInfo(tuple(xs), "float32"), TensorInfo(tuple(xs[:2]) + (1, 1), "float32")
    axes = {"axes": [2, 3], "keepdims": True}

    def step(op, ins, suffix, info=full, attrs=None):
        return ctx.emit(op, ins, attrs or {}, suffix=suffix, infos=[info], result=None if suffix else 0)[0]
    eps = ctx.r.claim(f"v{ctx.k}:epsilon")
    ctx.r.initializers[eps] = np.float32(ctx.attr("epsilon", 1e-5))
    channel = []
    for i, what in ((1, "scale"), (2, "B")):
        v = ctx.need_const(i, what).astype(np.float32).reshape(-1, 1, 1)
        channel.append(ctx.const_input(i, v, keep_name=False))
    x = ctx.x(0)
    d = step("Sub", [x, step("ReduceMean", [x], "mean", stat, axes)], "centred")
    var = step("ReduceMean", [step("Mul", [d, d], "square")], "var", stat, axes)
    norm = step("Div", [d, step("Sqrt", [step("Add", [var, eps], "var_eps", stat)], "std", stat)], "normed")
    step("Add", [step("Mul", [norm, channel[0]], "scaled"), channel[1]], "")


def _conv_transpose(ctx: Ctx):
    """ConvTranspose -> Conv2DTranspose (+ BiasAdd), with explicit pads and output_padding for the output size."""
    xs, ws, out = ctx.shape(0), ctx.shape(1), ctx.out_shape()
    if len(ws) != 4 or len(xs) != 4:
        ctx.fail(f"only 2-D transposed convolutions (NCHW input, 4-D weight) are supported; input {xs}, weight {ws}")
    kernel = as_ints(ctx.attr("kernel_shape", ws[2:]))
    if tuple(kernel) != tuple(ws[2:]):
        ctx.fail(f"kernel_shape {kernel} differs from the weight's {ws[2:]}")
    strides, dilations = as_ints(ctx.attr("strides", [1, 1])), as_ints(ctx.attr("dilations", [1, 1]))
    extra = as_ints(ctx.attr("output_padding", [0, 0]))
    group = int(ctx.attr("group", 1))
    full = [strides[i] * (xs[2 + i] - 1) + extra[i] + (kernel[i] - 1) * dilations[i] + 1 for i in range(2)]
    mode = ctx.attr("auto_pad", "NOTSET") or "NOTSET"
    if mode == "NOTSET" and ctx.attr("output_shape") is None:
        pads = as_ints(ctx.attr("pads", [0, 0, 0, 0]))
    elif mode == "VALID":
        pads = [0, 0, 0, 0]
    else:  # the ONNX rule: total padding from the output size; the odd pixel at the end for SAME_UPPER
        total = [full[i] - out[2 + i] for i in range(2)]
        if mode == "SAME_LOWER":
            pads = [total[0] - total[0] // 2, total[1] - total[1] // 2, total[0] // 2, total[1] // 2]
        else:
            pads = [total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2]
    if min(pads) < 0:
        ctx.fail(f"pads {pads} (an output larger than the transposed convolution makes)")
    got = [full[i] - pads[i] - pads[i + 2] for i in range(2)]
    if tuple(got) != tuple(out[2:]) or out[1] != ws[1] * group:
        ctx.fail(f"computed output size {got} differs from the model's {list(out[2:])}")
    attrs = {"pads": pads, "strides": strides, "dilations": dilations, "group": group, "output_padding": extra}
    if not ctx.has(2):
        ctx.emit("Conv2DTranspose", [ctx.x(0), ctx.x(1)], attrs)
        return
    y = ctx.emit("Conv2DTranspose", [ctx.x(0), ctx.x(1)], attrs, result=None)[0]
    ctx.emit("BiasAdd", [y, ctx.x(2)], {"axis": 1, "rank": 4}, suffix="bias")


def _block(op: str):
    def handler(ctx: Ctx):
        if len(ctx.shape(0)) != 4:
            ctx.fail(f"{ctx.n.op_type} of a rank-{len(ctx.shape(0))} tensor (NCHW only)")
        mode = ctx.attr("mode", "DCR") if op == "DepthToSpace" else "DCR"
        if mode not in ("DCR", "CRD"):
            ctx.fail(f"mode {mode!r}")
        ctx.emit(op, [ctx.x(0)], {"block_size": int(ctx.attr("blocksize")), "mode": mode})
    return handler


def _gather(ctx: Ctx):
    """Gather of a run-time tensor at constant indices (``x[:, 0]`` in PyTorch's export)."""
    xs = ctx.shape(0)
    axis = norm_axis(int(ctx.attr("axis", 0)), len(xs))
    idx = ctx.need_const(1, "indices").astype(np.int64)
    idx = np.where(idx < 0, idx + xs[axis], idx)
    if idx.size and (idx.min() < 0 or idx.max() >= xs[axis]):
        ctx.fail(f"indices out of range for dimension {axis} of size {xs[axis]}")
    if idx.ndim == 0:  # one index: the slice at it, that axis squeezed
        i = int(idx)
        ctx.emit("StridedSlice", [ctx.x(0)], {"starts": [i if a == axis else 0 for a in range(len(xs))],
                                              "ends": [i + 1 if a == axis else d for a, d in enumerate(xs)],
                                              "axes": list(range(len(xs))), "steps": [1] * len(xs),
                                              "squeeze": [axis]})
        return
    ctx.emit("Gather", [ctx.x(0), ctx.const_input(1, idx, keep_name=False)], {"axis": axis})


def _expand(ctx: Ctx):
    ctx.need_const(1, "shape")
    out = ctx.out_shape()
    if tuple(out) == tuple(ctx.shape(0)):
        ctx.r.values[ctx.n.output[0]] = ctx.x(0)
    else:
        ctx.emit("BroadcastTo", [ctx.x(0)], {"shape": list(out)})


def _tile(ctx: Ctx):
    repeats = as_ints(ctx.need_const(1, "repeats"))
    ctx.emit("Tile", [ctx.x(0)], {"multiples": repeats, "shape": list(ctx.shape(0)), "lead": 0})


def _reversed(ctx: Ctx, x: str, shape: tuple[int, ...], suffix: str) -> str:
    """``x`` reversed along axis 0 (time): a StridedSlice with step -1."""
    return ctx.emit("StridedSlice", [x], {"starts": [-1] + [0] * (len(shape) - 1),
                                          "ends": [-(2 ** 62)] + list(shape[1:]), "axes": list(range(len(shape))),
                                          "steps": [-1] + [1] * (len(shape) - 1), "squeeze": []},
                    suffix=suffix, infos=[TensorInfo(tuple(shape), "float32")], result=None)[0]


def _recurrent(kind: str):
    """ONNX LSTM / GRU -> one DynamicRNN / DynamicGRUV2 per direction (``quantflow/ops/rnn.py``), what CANN's
    fusion passes make of them; a reverse direction runs forward over the time-reversed sequence."""
    gates, op, outs = (4, "DynamicRNN", 8) if kind == "LSTM" else (3, "DynamicGRUV2", 6)
    default_acts = ["Sigmoid", "Tanh", "Tanh"] if kind == "LSTM" else ["Sigmoid", "Tanh"]

    def handler(ctx: Ctx):
        xs = ctx.shape(0)
        if len(xs) != 3:
            ctx.fail(f"input of rank {len(xs)} (expected time, batch, features)")
        if int(ctx.attr("layout", 0)):
            ctx.fail("layout 1 (batch-major input); CANN's DynamicRNN / DynamicGRUV2 are time-major (export with "
                     "layout 0)")
        direction = ctx.attr("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            ctx.fail(f"direction {direction!r}")
        dirs = 2 if direction == "bidirectional" else 1
        acts = [a.decode() if isinstance(a, bytes) else a for a in (ctx.attr("activations") or [])]
        if acts and [a.lower() for a in acts] != [a.lower() for a in default_acts * dirs]:
            ctx.fail(f"activations {acts}: CANN's {op} computes {', '.join(default_acts)} only (its ONNX parser does "
                     f"not read the attribute)")
        if ctx.attr("clip") is not None:
            ctx.fail(f"clip {ctx.attr('clip')}: CANN's ONNX parser does not pass it on to {op}")
        if kind == "LSTM" and int(ctx.attr("input_forget", 0)):
            ctx.fail(f"input_forget 1: CANN's {op} does not couple the input and forget gates")
        if kind == "GRU" and int(ctx.attr("linear_before_reset", 0)) != 1:
            ctx.fail("linear_before_reset 0: CANN's DynamicGRUV2 applies the reset gate after the hidden matrix "
                     "product (reset_after, ONNX linear_before_reset 1, as PyTorch exports nn.GRU); this GRU "
                     "computes another function there")
        t, batch, _ = xs
        w, r = ctx.need_const(1, "W").astype(np.float32), ctx.need_const(2, "R").astype(np.float32)
        hidden = r.shape[-1]
        if ctx.attr("hidden_size") is not None and int(ctx.attr("hidden_size")) != hidden:
            ctx.fail(f"hidden_size {ctx.attr('hidden_size')} differs from R's {r.shape}")
        b = ctx.need_const(3, "B").astype(np.float32) if ctx.has(3) else np.zeros((dirs, 2 * gates * hidden), np.float32)
        if ctx.has(4):
            lens = ctx.const(4)
            if lens is None or np.any(lens != t):
                ctx.fail("sequence_lens shorter than the sequence (or computed at run time); CANN's op reads full "
                         "sequences here")
        states = []
        for i, what in ((5, "initial_h"), (6, "initial_c"))[:2 if kind == "LSTM" else 1]:
            states.append(ctx.need_const(i, what).astype(np.float32) if ctx.has(i)
                          else np.zeros((dirs, batch, hidden), np.float32))
        if kind == "LSTM" and ctx.has(7) and np.any(ctx.need_const(7, "P")):
            ctx.fail("peepholes (input P): CANN's DynamicRNN is read without them")
        used = [bool(o) and o in ctx.r.read_values for o in ctx.n.output] + [False] * 3
        if kind == "LSTM" and used[2]:
            ctx.fail("the last cell state (output Y_c) is used; quantflow reads Y and Y_h of an LSTM")
        seq, last = [], []
        for d in range(dirs):
            reverse = direction == "reverse" or d == 1
            x = _reversed(ctx, ctx.x(0), xs, f"reverse{d}") if reverse else ctx.x(0)
            bias = b[d:d + 1]
            if kind == "LSTM":  # one bias, as DynamicRNN holds it
                bias = np.concatenate([b[d, :4 * hidden] + b[d, 4 * hidden:], np.zeros(4 * hidden, np.float32)])[None]
            params = [w[d:d + 1], r[d:d + 1], bias] + [s[d:d + 1] for s in states]
            names = []
            for j, v in enumerate(params):
                name = ctx.r.claim(f"v{ctx.k}:dir{d}_{('W', 'R', 'B', 'h0', 'c0')[j]}")
                ctx.r.initializers[name] = np.ascontiguousarray(v, np.float32)
                names.append(name)
            info = TensorInfo((t, batch, hidden), "float32")
            y = ctx.emit(op, [x, *names], {"hidden_size": int(hidden)}, suffix=f"dir{d}", infos=[info] * outs,
                         outputs=outs, result=None)[0]
            if used[1]:
                last.append(ctx.emit("StridedSlice", [y], {"starts": [t - 1, 0, 0], "ends": [t, batch, hidden],
                                                           "axes": [0, 1, 2], "steps": [1, 1, 1], "squeeze": []},
                                     suffix=f"last{d}", infos=[TensorInfo((1, batch, hidden), "float32")],
                                     result=None)[0])
            seq.append(_reversed(ctx, y, (t, batch, hidden), f"unreverse{d}") if reverse else y)
        if used[0]:
            info = TensorInfo((t, dirs, batch, hidden), "float32")
            if dirs == 1:
                ctx.emit("ExpandDims", seq, {"shape": list(info.shape)}, suffix="y", infos=[info])
            else:
                ctx.emit("Stack", seq, {"axis": 1}, suffix="y", infos=[info])
        if used[1]:
            if dirs == 1:
                ctx.r.values[ctx.n.output[1]] = last[0]
            else:
                yh = ctx.emit("Concat", last, {"axis": 0}, suffix="y_h",
                              infos=[TensorInfo((dirs, batch, hidden), "float32")], result=None)[0]
                ctx.r.values[ctx.n.output[1]] = yh
    return handler


HANDLERS = {
    "Conv": _conv, "Gemm": _gemm, "MatMul": _matmul, "BatchNormalization": _batchnorm,
    "Relu": _unary("ReLU"), "Clip": _clip, "Sigmoid": _unary("Sigmoid"), "HardSwish": _unary("HSwish"),
    "HardSigmoid": _hardsigmoid, "Mul": _mul, "Add": _add, "Sub": _binary("Sub"), "Div": _binary("Div"),
    "Concat": _concat, "MaxPool": _pool("MaxPool"), "AveragePool": _pool("AvgPool"),
    "GlobalAveragePool": _global_pool("AdaptiveAvgPool2D"), "GlobalMaxPool": _global_pool("MaxPool"),
    "Flatten": _static_shape("Flatten"), "Reshape": _static_shape("Reshape"), "Squeeze": _static_shape("Squeeze"),
    "Unsqueeze": _static_shape("ExpandDims"), "Transpose": _transpose, "Softmax": _softmax,
    "ReduceMean": _reduce("ReduceMean"), "Pad": _pad, "Slice": _slice, "Resize": _resize,
    "LayerNormalization": _layernorm, "Split": _split,
    "ReduceSum": _reduce("ReduceSum"), "ReduceMax": _reduce("ReduceMax"), "ReduceMin": _reduce("ReduceMin"),
    "LeakyRelu": _leaky_relu, "PRelu": _prelu, "Pow": _pow, "Max": _variadic("Maximum"), "Min": _variadic("Minimum"),
    "Sum": _variadic("Add"), "Sqrt": _unary("Sqrt"), "Exp": _unary("Exp"), "Log": _unary("Log"), "Erf": _unary("Erf"),
    "Neg": _unary("Neg"), "Abs": _unary("Abs"), "Reciprocal": _unary("Reciprocal"), "Tanh": _unary("Tanh"),
    "Softplus": _unary("Softplus"), "ConvTranspose": _conv_transpose, "SpaceToDepth": _block("SpaceToDepth"),
    "DepthToSpace": _block("DepthToSpace"), "Gather": _gather, "Expand": _expand, "Tile": _tile,
    "LSTM": _recurrent("LSTM"), "GRU": _recurrent("GRU"), "Upsample": _upsample, "ScatterND": _scatter_nd,
    "InstanceNormalization": _instance_norm,
}


# ----------------------------------------------------------------------------- entry point
