"""ONNX front-end: an ONNX model -> quantflow's graph IR.

Produces the IR the MindIR front-end (``mindir.py``) produces for the equivalent network, so that
BN folding, calibration, the INT8 scheme, the emulator and the deploy graphs work unchanged:

- a convolution with a bias is ``Conv2D`` + ``BiasAdd`` (axis 1), a ``Gemm`` is ``MatMul`` +
  ``BiasAdd`` (MindSpore's ``nn.Dense``), as MindSpore exports them; ``fold_for_quantization``
  fuses the bias and folds the BatchNorm;
- an ``Add`` of a constant per-channel vector to a Conv2D / 2-D MatMul output is that op's ``BiasAdd``
  (PyTorch's MatMul + Add, quantflow's own lowering of BiasAdd);
- ``BatchNormalization`` is ``BatchNorm`` with MindSpore's five outputs (only the first in use);
- ``Clip`` to [0, 6] is ``ReLU6`` (to [0, inf) ``ReLU``, other bounds ``Maximum`` / ``Minimum``); ``x * Sigmoid(x)``
  is ``SiLU``; ``HardSigmoid(1/6, 0.5)`` is ``HSigmoid``, other slopes ``HardSigmoid``; ``LeakyRelu`` is
  ``Maximum(x * a, x)`` as MindSpore's nn.LeakyReLU; ``GlobalAveragePool`` is ``AdaptiveAvgPool2D``;
  ``Flatten`` / ``Reshape`` / ``Squeeze`` / ``Unsqueeze`` carry their static output shape, as the IR's shape ops do;
  ``Slice`` is ``StridedSlice`` over every axis; a MatMul of an N-D input by a 2-D weight is a 2-D ``MatMul`` over
  its rows (as nn.Dense);
- ``ConvTranspose`` is ``Conv2DTranspose`` (+ ``BiasAdd``), ``LSTM`` / ``GRU`` one ``DynamicRNN`` /
  ``DynamicGRUV2`` per direction (``quantflow/ops/rnn.py``), ``InstanceNormalization`` its arithmetic steps;
  ``PRelu`` MindSpore's ``PReLU`` where its slope is one per channel, else ``max(x, 0) + slope * min(x, 0)``;
  the elementwise binaries broadcast as ONNX does, operands of any rank;
- a converter's leftover with a standard meaning (MediaPipe's transposed convolution with bias, as tf2onnx leaves
  it) is first rewritten as the standard ops computing it (``onnx_custom.standard_form``); any other op is refused
  naming it, its domain and the fix (``onnx_custom.unknown_op_fix``);
- pooling pads are explicit (``pad_mode`` "valid", "same" where they are MindSpore's same pads, else
  "pad"); ``ceil_mode`` becomes extra end padding, ``count_include_pad`` a ``Pad`` before the pool;
- ``Identity``, ``Dropout`` (inference) and float-to-float ``Cast`` are resolved away;
  ``Constant`` nodes, ``Shape`` / ``Size`` of the (static) tensors and every standard op whose inputs
  are all constants (the shape arithmetic exporters write, ``DequantizeLinear`` of stored weights, a
  ``Transpose`` of a weight) are evaluated here, with onnx's reference implementation;
- a model quantized already (integer ops, QuantizeLinear on run-time values) is refused (``refuse_quantized``);
- a channels-last input (``input_layout="NHWC"``, as tf2onnx writes TFLite and Keras models) is read with an NCHW
  input of the same name and a Transpose to NHWC after it (``_channels_first``), the layout AIPP feeds an ONNX
  model in (the reason is there); the Transpose back to NCHW that tf2onnx puts before the first convolution
  cancels with it.

Naming follows the MindIR front-end: the node at position ``k`` of the ONNX graph is ``v<k>`` and so
is its output value (``v<k>:<i>`` for the i-th output of a multi-output IR op; an extra IR node for
the same ONNX node, e.g. the ``BiasAdd`` of a ``Gemm``, is ``v<k>_bias``); the ONNX node name is the
IR node's ``scope`` (its readable layer path); initializers and graph inputs keep their names.
Floating-point tensors are float32 in the IR whatever their ONNX precision.  Every shape must be
static: a dynamic input dimension is an error naming the input (or is fixed by ``input_shape``); every other
value's shape is what the model computes at that input shape (``_value_shapes``), whatever the file declares.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..engine.onnx_builder import graph_inputs
from ..errors import UnsupportedNetworkError
from ..ir import Graph, Node, TensorInfo
from .onnx_custom import TRANSPOSE_CONV_BIAS, is_standard, standard_form, unknown_op_fix
from .onnx_cut import SUPPRESSION_OPS, cut, suppression_fix
from .onnx_ops import HANDLERS, Const, Ctx, ir_array, is_static

INPUT_LAYOUTS = ("NCHW", "NHWC")        # the layouts of an ONNX file's image input quantflow reads
_TO_NHWC, _TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]   # Transpose perms: NCHW -> NHWC, NHWC -> NCHW

_RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
_FLOAT = ("float16", "float32", "float64", "bfloat16")


def _dtype_name(elem_type: int) -> str:
    from onnx import helper
    try:
        name = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:  # bfloat16 and the float8 types have no NumPy dtype of their own
        return "float32"
    return "float32" if name in _FLOAT else name


def _dims(tensor_type) -> list | None:
    """The dims of a TensorTypeProto: ints where static, the dim_param (or '?') where not; None if unranked."""
    if not tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor_type.shape.dim]


# ----------------------------------------------------------------------------- the reader

class _Reader:
    def __init__(self, model, source: str, name: str, infos: dict[str, list], unknown_why: str = "",
                 fixed: dict[str, np.ndarray] | None = None):
        self.model, self.source, self.name = model, source, name
        self.fixed = fixed or {}                      # ONNX input -> the value each image is fed with
        self.g = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        self.values: dict[str, str | Const] = {}     # ONNX value -> IR tensor name or constant
        self.initializers: dict[str, np.ndarray] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.nodes: list[Node] = []
        self.producer: dict[str, Node] = {}
        self.used: set[str] = set()                   # every IR tensor / initializer name taken
        self.infos = infos                            # ONNX value -> [dims, elem_type] at the fixed input shape
        self.unknown_why = unknown_why                # why some value's shape stayed unknown (onnxruntime's error)
        self.skip: set[int] = set()                   # nodes fused into a later one (Sigmoid of a SiLU)
        self.silu: dict[int, str] = {}                # Mul node index -> x of x * Sigmoid(x)
        self.read_values: set[str] = set()            # ONNX values some needed node (or the graph output) reads

    # --------------------------------------------------------------- values and names

    def claim(self, name: str) -> str:
        while name in self.used:
            name += "_"
        self.used.add(name)
        return name

    def const(self, value: str) -> np.ndarray | None:
        v = self.values.get(value)
        return v.array if isinstance(v, Const) else None

    def tensor(self, value: str, where: str) -> str:
        """The IR tensor of an ONNX value; a constant becomes an initializer (float32 if float)."""
        if value not in self.values:
            raise UnsupportedNetworkError(f"{where}: input {value!r} is not defined before use")
        v = self.values[value]
        if isinstance(v, Const):
            if v.name not in self.initializers:
                self.initializers[v.name] = ir_array(v.array)
            return v.name
        return v

    def ir_shape(self, name: str) -> tuple[int, ...]:
        """The shape of an IR tensor or initializer."""
        return tuple(self.initializers[name].shape) if name in self.initializers else self.tensors[name].shape

    def onnx_shape(self, value: str, where: str) -> tuple[int, ...]:
        arr = self.const(value)
        if arr is not None:
            return tuple(arr.shape)
        dims = self.infos.get(value, [None])[0]
        if not is_static(dims):
            raise UnsupportedNetworkError(
                f"{where}: the shape of value {value!r} is unknown at the fixed input shape ({dims}): neither ONNX "
                f"shape inference nor a run of onnxruntime gave it{self.unknown_why}; quantflow's graph IR is static "
                f"in shape")
        return tuple(dims)

    def info(self, value: str, where: str) -> TensorInfo:
        shape = self.onnx_shape(value, where)
        return TensorInfo(shape, _dtype_name(self.infos[value][1]) if value in self.infos else "float32")

    # --------------------------------------------------------------- reading

    def read(self) -> Graph:
        from onnx import numpy_helper
        for t in self.g.initializer:
            self.values[t.name] = Const(numpy_helper.to_array(t), self.claim(t.name))
        inputs = []
        for i in graph_inputs(self.model):
            tt = i.type.tensor_type
            name = self.claim(i.name)
            self.tensors[name] = TensorInfo(tuple(_dims(tt)), _dtype_name(tt.elem_type))
            self.values[i.name] = name
            inputs.append(name)
        renamed = dict(zip((i.name for i in graph_inputs(self.model)), inputs))
        fixed = {renamed[k]: v for k, v in self.fixed.items()}
        inputs.sort(key=lambda i: i in fixed)   # the image input first
        needed = self._needed()
        self.read_values = {i for k in needed for i in self.g.node[k].input if i} | {o.name for o in self.g.output}
        self._find_silu(needed)
        for k, n in enumerate(self.g.node):
            if k in needed and k not in self.skip:
                self._node(k, n)
        outputs, constants = [], {}
        for o in self.g.output:
            v = self.values.get(o.name)
            if v is None:
                raise UnsupportedNetworkError(f"{self.source}: graph output {o.name!r} is not produced by any node")
            if isinstance(v, Const):   # reported by the graph stage, kept in the written graphs
                constants[o.name] = np.asarray(v.array)
                continue
            batch = self.tensors[inputs[0]].shape[0] if inputs and self.tensors[inputs[0]].shape else 1
            if batch > 1 and self.tensors[v].shape[:1] != (batch,):
                raise UnsupportedNetworkError(
                    f"{self.source}: graph output {o.name!r} has shape {list(self.tensors[v].shape)} at input batch "
                    f"{batch}, without the batch as its first axis (a sequence model's (T, batch, classes)); quantflow "
                    f"runs such a network image by image: set the batch (model.input_shape[0]) to 1")
            outputs.append(v)
        if not outputs:
            raise UnsupportedNetworkError(f"{self.source}: every graph output ({', '.join(constants)}) is a constant: "
                                          f"nothing is computed from the inputs to quantize")
        g = Graph(self.nodes, inputs, outputs, self.initializers, self.tensors, name=self.name, fixed_inputs=fixed,
                  constant_outputs=constants)
        g.prune()
        g.check()
        return g

    def _needed(self) -> set[int]:
        """The nodes the graph outputs depend on (an unused branch may hold anything)."""
        prod = {o: k for k, n in enumerate(self.g.node) for o in n.output if o}
        need, stack = set(), [o.name for o in self.g.output]
        while stack:
            k = prod.get(stack.pop())
            if k is None or k in need:
                continue
            need.add(k)
            stack.extend(i for i in self.g.node[k].input if i)
        return need

    def _find_silu(self, needed: set[int]) -> None:
        """x * Sigmoid(x) whose Sigmoid only that Mul reads: one SiLU, as MindSpore's nn.SiLU exports."""
        nodes = self.g.node
        prod = {o: k for k, n in enumerate(nodes) for o in n.output if o}
        readers: dict[str, int] = {}
        for k in needed:
            for i in nodes[k].input:
                readers[i] = readers.get(i, 0) + 1
        outs = {o.name for o in self.g.output}
        for k in sorted(needed):
            n = nodes[k]
            if n.op_type != "Mul" or n.domain not in ("", "ai.onnx") or len(n.input) != 2:
                continue
            for a, b in (n.input, n.input[::-1]):
                j = prod.get(b)
                if j is not None and nodes[j].op_type == "Sigmoid" and nodes[j].domain in ("", "ai.onnx") \
                        and nodes[j].input[0] == a and readers.get(b) == 1 and b not in outs and a != b:
                    self.skip.add(j)
                    self.silu[k] = a
                    break

    # --------------------------------------------------------------- one ONNX node

    def _node(self, k: int, n) -> None:
        where = f"ONNX node {n.name} (v{k}, {n.op_type})" if n.name else f"ONNX node v{k} ({n.op_type})"
        ctx = Ctx(self, k, n, where)
        for i in n.input:
            if i and i not in self.values and k not in self.silu:  # a SiLU's Mul reads its skipped Sigmoid
                ctx.fail(f"input {i!r} is not defined before use (the ONNX graph is not topologically sorted?)")
        standard = n.domain in ("", "ai.onnx")
        if standard and n.op_type in ("Identity", "Dropout") or (standard and n.op_type == "Cast" and ctx.float_cast()):
            if n.op_type == "Dropout":
                ctx.dropout_check()
            self.values[n.output[0]] = self.values[n.input[0]]
            return
        if standard and self._foldable(n):
            self._fold(ctx)
            return
        handler = HANDLERS.get(n.op_type) if is_standard(n.domain, n.op_type, self.opset) else None
        if handler is None:
            name = n.name or f"v{k}"
            domain = "ai.onnx, the default" if standard else repr(n.domain)
            fix = (suppression_fix(n.input[0], n.input[1]) if standard and n.op_type in SUPPRESSION_OPS
                   else unknown_op_fix(n.domain, n.op_type, self.opset))
            raise UnsupportedNetworkError(
                f"{self.source}: unsupported ONNX op {n.op_type!r} (domain {domain}) at node {name}: quantflow cannot "
                f"run or quantize it. Fix: {fix} (supported ONNX ops: "
                f"{', '.join(sorted(HANDLERS))}, plus Identity, Dropout, Cast between float types, any standard op "
                f"on constants, and MediaPipe's {TRANSPOSE_CONV_BIAS[0]} as tf2onnx leaves it)")
        handler(ctx)

    def _foldable(self, n) -> bool:
        if n.op_type in _RANDOM:
            return False
        if n.op_type in ("Shape", "Size"):
            return True
        if not n.input:
            return n.op_type == "Constant"
        return all(not i or isinstance(self.values.get(i), Const) for i in n.input)

    def _fold(self, ctx: "Ctx") -> None:
        n, k = ctx.n, ctx.k
        if n.op_type in ("Shape", "Size"):
            shape = self.onnx_shape(n.input[0], ctx.where)
            if n.op_type == "Size":
                results = [np.array(int(np.prod(shape)), np.int64)]
            else:
                rank = len(shape)
                start, end = ctx.attr("start", 0), ctx.attr("end", rank)
                results = [np.array(shape[slice(start, end)], np.int64)]
        else:
            results = _evaluate(self.model, n, {i: self.const(i) for i in n.input if i}, ctx)
        for j, (o, arr) in enumerate(zip(n.output, results)):
            if o:
                self.values[o] = Const(np.asarray(arr), self.claim(f"v{k}" if len(n.output) == 1 else f"v{k}_{j}"))


def _evaluate(model, n, consts: dict[str, np.ndarray], ctx) -> list[np.ndarray]:
    """One node on constant inputs, with onnx's reference implementation at the model's opsets."""
    from onnx import TypeProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator
    graph = helper.make_graph([n], "fold", [], [helper.make_value_info(o, TypeProto()) for o in n.output if o],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    m = helper.make_model(graph, opset_imports=list(model.opset_import))
    try:
        return list(ReferenceEvaluator(m).run(None, {}))
    except Exception as err:  # the reference implementation's own errors
        ctx.fail(f"could not evaluate it on its constant inputs: {err}")


def _dynamic_message(source: str, name: str, dims) -> str:
    if dims is None:
        return (f"{source}: input {name!r} has no shape; quantflow needs static shapes: pass "
                f"read_onnx(..., input_shape=(N, C, H, W)) or export the model with a fixed input shape")
    shown = "[" + ", ".join(str(d) for d in dims) + "]"
    bad = [f"dimension {i} is {d!r}" for i, d in enumerate(dims) if not (isinstance(d, int) and d > 0)]
    param = next((d for d in dims if isinstance(d, str) and d != "?"), "batch")
    return (f"{source}: input {name!r} has a dynamic shape {shown} ({', '.join(bad)}); quantflow needs static "
            f"shapes: export the ONNX with a fixed batch size (e.g. torch.onnx.export without dynamic_axes), fix it "
            f"with `python -m onnxruntime.tools.make_dynamic_shape_fixed --dim_param {param} --dim_value 1 "
            f"in.onnx out.onnx`, or pass read_onnx(..., input_shape=(N, C, H, W))")


def read_onnx(path, input_shape: Sequence[int] | None = None, input_layout: str = "NCHW",
              extra_inputs: dict | None = None, outputs: Sequence[str] = ()) -> Graph:
    """Read an ONNX model (a file, or an ``onnx.ModelProto``) into the graph IR.

    ``input_shape``: the shape of the image input, fixing its dynamic dimensions (a static
    dimension must agree); without it every input dimension must be static in the model.  ``input_layout``: the
    layout of the file's input; with "NHWC" ``input_shape`` is still N, C, H, W, and the IR's input is N, C, H, W
    (``_channels_first``).  ``extra_inputs``: input name -> the value each image is fed with, for every input
    other than the image (``model.inputs``; ``quantflow.data.extra_inputs``): those inputs stay inputs (the
    image input first), their values in ``Graph.fixed_inputs``, their batch axis fixed at the image's.
    ``outputs``: tensors the model is cut at (``model.outputs``, ``onnx_cut.cut``): they become its outputs."""
    import onnx

    if input_layout not in INPUT_LAYOUTS:
        raise UnsupportedNetworkError(f"input_layout {input_layout!r}: expected one of {', '.join(INPUT_LAYOUTS)}")

    if isinstance(path, onnx.ModelProto):
        model, source, name = path, path.graph.name or "onnx model", path.graph.name or "graph"
        model_copy = onnx.ModelProto()
        model_copy.CopyFrom(model)
        model = model_copy
    else:
        path = Path(path)
        if not path.is_file():
            raise UnsupportedNetworkError(f"ONNX file not found: {path}")
        source, name = str(path), path.stem
        try:
            model = onnx.load(str(path))
        except Exception as err:  # protobuf's DecodeError, missing external data
            raise UnsupportedNetworkError(f"{path} is not a readable ONNX file: {err}") from None
    if model.graph.sparse_initializer:
        raise UnsupportedNetworkError(f"{source}: sparse initializers are not supported")
    if outputs:
        model = cut(model, outputs, source)
    refuse_quantized(model, source)
    fixed = _fix_extra_inputs(model, source, extra_inputs or {}, input_shape)
    if input_shape is not None:
        _fix_input_shape(model, source, input_shape, input_layout, fixed)
    for i in graph_inputs(model):
        dims = _dims(i.type.tensor_type)
        if not is_static(dims):
            raise UnsupportedNetworkError(_dynamic_message(source, i.name, dims))
    model = standard_form(model, source)
    model, infos, why = _value_shapes(model, source)
    graph = _Reader(model, source, name, infos, why, fixed).read()
    return _channels_first(graph, source) if input_layout == "NHWC" else graph


def file_input_shape(shape: Sequence[int], input_layout: str) -> list[int]:
    """``shape`` (N, C, H, W) in the order of the ONNX file's input: N, H, W, C for an "NHWC" file."""
    shape = [int(d) for d in shape]
    return [shape[k] for k in _TO_NHWC] if input_layout == "NHWC" and len(shape) == 4 else shape


def file_input_batch(x: np.ndarray, input_layout: str) -> np.ndarray:
    """A batch ``x`` (N, C, H, W: the preprocessed images) as the ONNX file takes it (N, H, W, C for "NHWC")."""
    return np.ascontiguousarray(x.transpose(_TO_NHWC)) if input_layout == "NHWC" else x


def _channels_first(g: Graph, source: str) -> Graph:
    """``g``, read from a file whose input is channels-last (N, H, W, C), with that input N, C, H, W under the same
    name, feeding a Transpose to N, H, W, C in front of the nodes that read it; each Transpose straight back to
    N, C, H, W (tf2onnx writes one before the first convolution) is cancelled with it.

    Why NCHW (docs/onnx-models.md#channels-last-inputs): CANN's ATC reference, ``--input_format``: an ONNX model's
    input is NCHW (the default), NCDHW or ND, and with ``--insert_op_conf`` (AIPP) only NCHW or NHWC, so NCHW; its
    AIPP "Configuration File Template", general restriction 8: with AIPP a Caffe or ONNX model's data format can
    only be NCHW (TensorFlow's NHWC or NCHW), AIPP's output being stored NC1HWC0.  (The NHWC that page and
    ``--input_format`` force on "the input node connected to AIPP" is the layout of the uint8 frames the .om is fed,
    not the model's.)  Cancelling the pair computes exactly what the file computes (a Transpose only moves values);
    atc does the same: CANN's ONNX parser reads Transpose as TransposeD (its 2020 plugin registers
    ``ai.onnx::11::Transpose`` so), and GE's TransOpSymmetryEliminationPass removes two TransposeD whose perms
    compose to the identity (graphengine ``ge/graph/passes/transop_symmetry_elimination_pass.cc``,
    ``JudgeTransposeDBack2Raw``)."""
    x = g.inputs[0]
    info = g.tensors[x]
    if len(info.shape) != 4:
        raise UnsupportedNetworkError(f"{source}: input {x!r} has shape {list(info.shape)}; input_layout \"NHWC\" "
                                      f"needs an image input N, H, W, C")
    taken = g.names()
    nhwc, step = _free(f"{x}:nhwc", taken), _free(f"{x}:to_nhwc", taken)
    for node in g.nodes:
        node.inputs = [nhwc if i == x else i for i in node.inputs]
    g.outputs = [nhwc if o == x else o for o in g.outputs]
    g.nodes.insert(0, Node(step, "Transpose", [x], [nhwc], {"perm": list(_TO_NHWC)}))
    g.tensors[nhwc] = info
    g.tensors[x] = TensorInfo(tuple(info.shape[k] for k in _TO_NCHW), info.dtype)
    back = [n for n in g.nodes[1:] if n.op == "Transpose" and n.inputs == [nhwc]
            and list(n.attrs["perm"]) == _TO_NCHW and n.outputs[0] not in g.outputs]
    for node in back:
        for other in g.nodes:
            other.inputs = [x if i == node.outputs[0] else i for i in other.inputs]
        g.tensors.pop(node.outputs[0], None)
    g.nodes = [n for n in g.nodes if not any(n is b for b in back)]
    if nhwc not in g.outputs and not any(nhwc in n.inputs for n in g.nodes[1:]):
        del g.nodes[0], g.tensors[nhwc]
    g.check()
    return g


def _free(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    return name


def onnxruntime_model(path, input_shape: Sequence[int], input_layout: str = "NCHW", extra_inputs: dict | None = None,
                      outputs: Sequence[str] = ()):
    """What onnxruntime runs for the ONNX file at ``path`` (as the reference for the reader): the file's path as
    given, or, where it holds ops a converter left behind with a standard meaning (``onnx_custom.standard_form``),
    their standard form at ``input_shape`` (as configured: N, C, H, W whatever ``input_layout``), serialized; cut at
    ``outputs`` where given (``model.outputs``), serialized.  It takes the file's own input layout
    (``file_input_batch``)."""
    import onnx

    leftovers = any(n.op_type in TRANSPOSE_CONV_BIAS for n in onnx.load(str(path), load_external_data=False).graph.node)
    if not leftovers and not outputs:
        return str(path)
    model = onnx.load(str(path))
    if outputs:
        model = cut(model, outputs, str(path))
    if not leftovers:
        return model.SerializeToString()
    fixed = _fix_extra_inputs(model, str(path), extra_inputs or {}, input_shape)
    _fix_input_shape(model, str(path), input_shape, input_layout, fixed)
    return standard_form(model, str(path)).SerializeToString()


def several_inputs_message(source: str, names: list[str]) -> str:
    """Why a model with ``names`` as the inputs left for the image cannot be read, and the fix."""
    if not names:
        return f"{source}: model.inputs gives a value for every input; one of them must be the image input"
    shown = ", ".join(repr(n) for n in names)
    return (f"{source} has {len(names)} inputs ({shown}) left for the images; quantflow feeds the images to one and "
            f"takes every other input's value from the configuration: add them to [model.inputs], e.g. "
            f"{names[-1]} = {{ value = [1.0, 1.0] }} (the value each image is fed with)")


def _fix_extra_inputs(model, source: str, extra: dict, input_shape: Sequence[int] | None) -> dict[str, np.ndarray]:
    """The inputs ``extra`` names (other than the image) given static dims (the image batch, then the shape of
    one image's value, ``extra_inputs.sample_value``) in ``model``; returns input name -> one image's value."""
    from ..data.extra_inputs import FIELD, sample_value

    if not extra:
        return {}
    by_name = {i.name: i for i in graph_inputs(model)}
    unknown = [k for k in extra if k not in by_name]
    if unknown:
        raise UnsupportedNetworkError(
            f"{source}: {FIELD}.{unknown[0]} names no input of the model (its inputs: "
            f"{', '.join(repr(k) for k in by_name)})")
    image = [k for k in by_name if k not in extra]
    if len(image) != 1:
        raise UnsupportedNetworkError(several_inputs_message(source, image))
    batch = int(input_shape[0]) if input_shape is not None else (_dims(by_name[image[0]].type.tensor_type) or [0])[0]
    if not (isinstance(batch, int) and batch > 0):
        raise UnsupportedNetworkError(f"{source}: the image input {image[0]!r} has a dynamic batch: give input_shape")
    values = {}
    for name, value in extra.items():
        tt = by_name[name].type.tensor_type
        dims = _dims(tt)
        v = sample_value(name, value, dims, _dtype_name(tt.elem_type), source)
        if isinstance(dims[0], int) and dims[0] > 0 and dims[0] != batch:
            raise UnsupportedNetworkError(
                f"{source}: input {name!r} ({FIELD}.{name}) is declared {dims}: its first axis must be the images' "
                f"batch, {batch} (model.input_shape[0])")
        del tt.shape.dim[:]
        for d in (batch,) + v.shape:
            tt.shape.dim.add().dim_value = int(d)
        values[name] = v
    return values


# ----------------------------------------------------------------------------- shapes at the fixed input shape

def _value_shapes(model, source: str):
    """Every value's shape and element type at the model's (now static) input shape, whatever the exporter
    wrote: its own ``value_info`` and output shapes are dropped (exporters leave stale ones, e.g. an output
    declared [1, seqlen] that computes [T, 1, classes]), ONNX shape inference runs on the rest, and the values it
    leaves unknown (a Reshape target built from Shape -> Gather -> Concat, and everything after it) are taken from
    one onnxruntime run of the model at that shape with those values exposed as outputs.

    Returns the inferred model, {value: [dims, elem_type]} and why some shapes could not be found ("" if all were)."""
    import onnx

    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.value_info[:]
    for o in bare.graph.output:
        if o.type.HasField("tensor_type"):
            o.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(bare, data_prop=True)
    except Exception:
        try:
            inferred = onnx.shape_inference.infer_shapes(bare)
        except Exception as err:
            raise UnsupportedNetworkError(f"{source}: ONNX shape inference failed: {err}") from None
    infos: dict[str, list] = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if vi.type.HasField("tensor_type"):
            infos[vi.name] = [_dims(vi.type.tensor_type), vi.type.tensor_type.elem_type]
    consts = {t.name for t in model.graph.initializer}
    unknown = [o for n in inferred.graph.node for o in n.output
               if o and o not in consts and not (o in infos and is_static(infos[o][0]) and infos[o][1])]
    why = ""
    if unknown:
        try:
            infos.update(_onnxruntime_shapes(bare, list(dict.fromkeys(unknown))))
        except Exception as err:  # onnxruntime's own errors (an op it lacks, a shape it refuses)
            why = f" (onnxruntime: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__})"
    return inferred, infos, why


def _onnxruntime_shapes(model, values: list[str]) -> dict[str, list]:
    """{value: [dims, elem_type]} of ``values`` from one onnxruntime run on zeros at the model's input shape."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_empty_tensor_value_info(v) for v in values)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feeds = {}
    for i in graph_inputs(probe):
        tt = i.type.tensor_type
        feeds[i.name] = np.zeros(_dims(tt), helper.tensor_dtype_to_np_dtype(tt.elem_type))
    outs = sess.run(values, feeds)
    return {v: [list(a.shape), helper.np_dtype_to_tensor_dtype(a.dtype)] for v, a in zip(values, outs)}


# ----------------------------------------------------------------------------- models quantized already

# integer or quantize/dequantize arithmetic written by a quantization tool (onnxruntime.quantization, ...)
_QUANTIZED = {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul", "QGemm",
              "DynamicQuantizeLSTM", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QAttention", "QEmbedLayerNorm"}


def refuse_quantized(model, source: str) -> None:
    """An already quantized model (integer ops, or QuantizeLinear on run-time values: QDQ pairs) is refused:
    quantflow quantizes the float network itself.  A DequantizeLinear of a stored weight alone (weights kept in
    int8 for size) is not quantized arithmetic and is folded when read."""
    g = model.graph
    consts = {t.name for t in g.initializer} | {o for n in g.node if n.op_type == "Constant" for o in n.output}
    counts: dict[str, int] = {}
    first = None
    for k, n in enumerate(g.node):
        quantized = n.op_type in _QUANTIZED or n.op_type.startswith("QLinear") or \
            (n.op_type == "QuantizeLinear" and n.input and n.input[0] not in consts)
        if quantized:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
            first = first or (n.name or f"v{k}")
    if counts:
        found = ", ".join(f"{op} x{c}" for op, c in sorted(counts.items(), key=lambda kv: -kv[1]))
        raise UnsupportedNetworkError(
            f"{source} is already quantized: it computes with {found} (first at node {first}), as a quantization "
            f"tool writes it (e.g. onnxruntime.quantization). quantflow quantizes a float network itself for the "
            f"Ascend INT8 scheme and cannot take integer arithmetic over: give model.onnx the float (FP32) model "
            f"this one was quantized from")


def _fix_input_shape(model, source: str, shape: Sequence[int], input_layout: str = "NCHW", extra=()) -> None:
    """The image input's dims (the one graph input not in ``extra``) set to ``shape`` (as configured: N, C, H, W
    for an image input, in the file's order ``file_input_shape``); a static dim of the file must agree."""
    inputs = [i for i in graph_inputs(model) if i.name not in extra]
    if len(inputs) != 1:
        raise UnsupportedNetworkError(several_inputs_message(source, [i.name for i in inputs]))
    given, shape = list(shape), file_input_shape(shape, input_layout)
    tt = inputs[0].type.tensor_type
    dims = _dims(tt)
    if dims is not None and len(dims) != len(shape):
        raise UnsupportedNetworkError(f"{source}: input {inputs[0].name!r} has rank {len(dims)}, input_shape {shape}")
    for i, d in enumerate(dims or []):
        if isinstance(d, int) and d > 0 and d != shape[i]:
            said = f"input_shape {given}" + (f" (N, H, W, C in the file: {shape})" if shape != given else "")
            other = "NCHW" if input_layout == "NHWC" else "NHWC"
            fits = len(given) == 4 and all(not (isinstance(f, int) and f > 0) or f == o
                                           for f, o in zip(dims, file_input_shape(given, other)))
            hint = f"; the file's input is {other}: set model.input_layout = \"{other}\"" if fits else ""
            raise UnsupportedNetworkError(
                f"{source}: input {inputs[0].name!r} has static shape {dims}, which {said} contradicts{hint}")
    del tt.shape.dim[:]
    for d in shape:
        tt.shape.dim.add().dim_value = d
