"""MindIR front-end: a MindSpore MINDIR file -> quantflow's graph IR.

Reads the protobuf with the schema MindSpore ships (``mindspore.train.mind_ir_pb2``).  In a
MindIR, ``graph.node`` lists the CNodes in execution order; a CNode's ``op_type`` is
``REF::<primitive key>`` and ``model.primitives`` holds that primitive's type and attributes.
Since MindSpore 2.x many former attributes (BatchNorm's epsilon, MatMul's transpose flags,
ReduceMean's axis) are constant inputs (``Constant`` nodes).  Parameters are
``graph.parameter`` tensors, read through ``Load`` nodes.

Plumbing is resolved away here: Load (-> the parameter), Depend (-> its first input),
UpdateState and monads (dropped), MakeTuple / TupleGetItem (-> the tuple's elements or the
producing op's n-th output) and Constant (-> a constant input the op definition decodes).
Every other primitive must be in the op registry; one that is not is an error naming the op
type and the node.  A node whose inputs are all constants (parameters, constants, or values folded
before it) is computed once here and becomes a constant itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..engine.runner import constant_outputs
from ..errors import UnsupportedNetworkError
from ..ir import Graph, Node, TensorInfo
from ..ops import Const, TensorList, get as get_op

_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
           9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64, 17: np.float64}
_PLUMBING = {"Load", "Depend", "UpdateState", "MakeTuple", "TupleGetItem", "Constant", "Return"}


class _Monad:
    """UpdateState / UMONAD / IOMONAD values: ordering tokens with no data."""


_MONAD = _Monad()


@dataclass
class _Tuple:
    items: list


@dataclass
class _MultiOutput:
    """A node with a tuple output, before TupleGetItem picks an element."""
    node: Node


def _pb():
    from mindspore.train import mind_ir_pb2
    return mind_ir_pb2


# ----------------------------------------------------------------------------- decoding

def decode_tensor(t) -> np.ndarray:
    dtype = _DTYPES.get(t.data_type)
    if dtype is None:
        raise UnsupportedNetworkError(f"tensor {t.name or '?'}: unsupported MindIR data type {t.data_type}")
    shape = tuple(int(d) for d in t.dims)
    if t.raw_data:
        return np.frombuffer(t.raw_data, dtype=dtype).reshape(shape).copy()
    for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        values = getattr(t, field)
        if len(values):
            return np.asarray(values, dtype=dtype).reshape(shape)
    if t.HasField("external_data") and t.external_data.location:
        raise UnsupportedNetworkError(
            f"parameter {t.name}: stored in external file {t.external_data.location!r}; export the MindIR as a "
            f"single file (models over 1 GB are split by MindSpore)")
    return np.zeros(shape, dtype=dtype)


def decode_attr(a):
    """An AttributeProto -> a Python value (scalars, strings, tuples, arrays, or the monad marker)."""
    T = _pb().AttributeProto
    t = a.type
    # scalars inside a tuple keep their value in the repeated field (ints/floats/doubles)
    if t == T.FLOAT:
        return float(a.floats[0]) if len(a.floats) else float(a.f)
    if t == T.DOUBLE:
        return float(a.doubles[0]) if len(a.doubles) else float(a.d)
    if t == T.BOOL:
        return bool(a.ints[0]) if len(a.ints) else bool(a.i)
    if t in (T.INT8, T.INT16, T.INT32, T.INT64, T.UINT8, T.UINT16, T.UINT32, T.UINT64):
        return int(a.ints[0]) if len(a.ints) else int(a.i)
    if t == T.STRING:
        return a.s.decode() if isinstance(a.s, bytes) else a.s
    if t in (T.TUPLE, T.LIST):
        return tuple(decode_attr(v) for v in a.values)
    if t == T.TENSOR:
        return decode_tensor(a.t)
    if t == T.TENSORS and len(a.tensors):
        return decode_tensor(a.tensors[0])
    if t in (T.UMONAD, T.IOMONAD):
        return _MONAD
    if t == T.NONE:
        return None
    if t == T.SCALAR:  # a scalar stored with its own element type
        for field in ("i", "f", "d"):
            if a.HasField(field):
                return getattr(a, field)
    return ("<unknown attribute type>", int(t))


def _info(dims, data_type: int) -> TensorInfo:
    """Float tensors are float32 in the IR whatever their MindIR precision (the emulator models float16)."""
    dtype = np.dtype(_DTYPES.get(data_type, np.float32)).name
    return TensorInfo(tuple(int(d) for d in dims), "float32" if dtype == "float16" else dtype)


def _shapes(node) -> list[TensorInfo]:
    """Output shapes/dtypes recorded by MindSpore's shape inference (the 'shape' attribute)."""
    for a in node.attribute:
        if a.name == "shape":
            tensors = list(a.tensors)
            if not tensors and a.values:  # a tuple output: one tensor per element
                tensors = [v.tensors[0] for v in a.values if v.tensors]
            return [_info(t.dims, t.data_type) for t in tensors]
    return []


# ----------------------------------------------------------------------------- per-node context

class MindirNodeContext:
    """What an op definition sees of one MindIR CNode while turning it into an IR node."""

    def __init__(self, reader: "_Reader", node_name: str, op_type: str, args: list, prim: dict,
                 out_infos: list[TensorInfo]):
        self.reader, self.node_name, self.op_type = reader, node_name, op_type
        self.args, self.prim, self.out_infos = args, prim, out_infos
        self.used_outputs: set[int] | None = None

    def fail(self, why: str):
        raise UnsupportedNetworkError(f"node {self.node_name} ({self.op_type}): {why}")

    def tensor(self, i: int) -> str:
        if i >= len(self.args):
            self.fail(f"expected a tensor as input {i}, the node has {len(self.args)} inputs")
        v = self.args[i]
        if isinstance(v, str):
            return v
        if isinstance(v, Const) and isinstance(v.value, (np.ndarray, int, float)):
            return self.reader.add_constant(f"{self.node_name}:const{i}", v.value)
        self.fail(f"input {i} is {v!r}, expected a tensor")

    def operand(self, i: int) -> str:
        """``tensor(i)`` as an operand of float arithmetic: MindSpore promotes an integer operand to the float
        type (a YOLO head's int32 strides times float anchors); a constant one becomes a float32 constant."""
        name = self.tensor(i)
        if self.out_infos and self.out_infos[0].dtype.startswith("float"):
            value = self.reader.initializers.get(name)
            if value is not None and not np.issubdtype(value.dtype, np.floating):
                self.reader.initializers[f"{name}:float"] = value.astype(np.float32)
                return f"{name}:float"
            if value is None and not self.reader.tensors[name].dtype.startswith("float"):
                self.fail(f"input {i} is an {self.reader.tensors[name].dtype} tensor computed at run time in float "
                          f"arithmetic; quantflow runs float networks")
        return name

    def indices(self, i: int) -> str:
        """Input ``i`` as a constant int64 index tensor (TensorScatterUpdate's indices)."""
        v = self.args[i] if i < len(self.args) else None
        value = v.value if isinstance(v, Const) else self.reader.initializers.get(v) if isinstance(v, str) else None
        if value is None or not np.issubdtype(np.asarray(value).dtype, np.integer):
            self.fail(f"input {i} (indices) is computed at run time or not integer; quantflow needs constant indices")
        name = f"{self.node_name}:indices{i}"
        self.reader.initializers[name] = np.asarray(value, np.int64)
        return name

    def tensors(self, i: int) -> list[str]:
        v = self.args[i] if i < len(self.args) else None
        if isinstance(v, TensorList):
            return list(v.names)
        if isinstance(v, str):
            return [v]
        self.fail(f"input {i} is {v!r}, expected a tuple of tensors")

    def attr(self, key: str, default=None):
        return self.prim.get(key, default)

    def get(self, i: int, key: str, default=None):
        """A constant input when MindSpore passes it as input ``i`` (2.x style), else the attribute ``key``."""
        if i < len(self.args) and isinstance(self.args[i], Const):
            v = self.args[i].value
            return v.item() if isinstance(v, np.ndarray) and v.ndim == 0 else v
        if i < len(self.args) and isinstance(self.args[i], str):
            self.fail(f"input {i} ({key}) is computed at run time; quantflow needs it to be a constant")
        return self.prim.get(key, default)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.reader.shape(name)

    def out_shape(self, i: int) -> tuple[int, ...]:
        if i >= len(self.out_infos):
            self.fail("MindSpore recorded no output shape")
        return self.out_infos[i].shape

    def only_output(self, i: int) -> None:
        """The op has a tuple output of which the network may only use element ``i``."""
        self.used_outputs = {i}


# ----------------------------------------------------------------------------- the reader

class _Reader:
    def __init__(self, model, source: str):
        self.model, self.source = model, source
        self.graph = model.graph
        self.prims = {p.name: p for p in model.primitives}
        self.values: dict[str, object] = {}
        self.initializers: dict[str, np.ndarray] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.nodes: list[Node] = []
        self.restricted: dict[str, tuple[Node, set[int]]] = {}

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.initializers:
            return tuple(self.initializers[name].shape)
        return self.tensors[name].shape

    def add_constant(self, name: str, value) -> str:
        # a number used as a tensor operand (x * 2, x / 4.0) joins float32 arithmetic; an integer array
        # (indices, a grid's coordinates) keeps its type (``operand`` promotes it where arithmetic needs)
        arr = np.asarray(value)
        if not (isinstance(value, np.ndarray) and np.issubdtype(arr.dtype, np.integer)) and arr.dtype != np.float32:
            arr = arr.astype(np.float32)
        self.initializers[name] = arr
        return name

    def read(self) -> Graph:
        if self.model.functions:
            names = ", ".join(f.name for f in self.model.functions[:5])
            raise UnsupportedNetworkError(
                f"{self.source}: the MindIR holds {len(self.model.functions)} sub-graph(s) ({names}); quantflow reads "
                f"flat graphs only (control flow or cell calls that MindSpore did not inline)")
        for p in self.graph.parameter:
            arr = decode_tensor(p)
            # float16 parameters (a deploy network's float part) hold float32-exact values
            self.initializers[p.name] = arr.astype(np.float32) if arr.dtype == np.float16 else arr
            self.values[p.name] = p.name
        inputs = []
        for i in self.graph.input:
            if i.name in self.values:
                continue
            t = i.tensor[0]
            self.tensors[i.name] = _info(t.dims, t.data_type)
            self.values[i.name] = i.name
            inputs.append(i.name)
        for n in self.graph.node:
            self._node(n)
        outputs = []
        for o in self.graph.output:
            outputs.extend(self._flatten_output(self.values.get(o.name), o.name))
        g = Graph(self.nodes, inputs, outputs, self.initializers, self.tensors, name=Path(self.source).stem)
        self._check_restricted(g)
        g.prune()
        g.check()
        return g

    def _check_restricted(self, g: Graph) -> None:
        consumers = g.consumers()
        for node, allowed in self.restricted.values():
            for i, out in enumerate(node.outputs):
                if i not in allowed and (out in consumers or out in g.outputs):
                    raise UnsupportedNetworkError(
                        f"node {node.name} ({node.op}): the network uses output {i}, quantflow supports only "
                        f"output(s) {sorted(allowed)} of this op")

    def _flatten_output(self, v, name: str) -> list[str]:
        if isinstance(v, str):
            return [v]
        if isinstance(v, _Tuple):
            return [t for item in v.items for t in self._flatten_output(item, name)]
        raise UnsupportedNetworkError(f"{self.source}: graph output {name} is not a tensor ({v!r})")

    def _arg(self, name: str):
        if name not in self.values:
            raise UnsupportedNetworkError(f"{self.source}: node input {name!r} is not defined before use")
        v = self.values[name]
        if isinstance(v, _Tuple):
            if all(isinstance(x, str) for x in v.items):
                return TensorList(tuple(v.items))
            if all(isinstance(x, Const) for x in v.items):
                return Const(tuple(x.value for x in v.items))
        if isinstance(v, _MultiOutput):
            raise UnsupportedNetworkError(
                f"node {v.node.name} ({v.node.op}): its tuple output is used whole; quantflow needs TupleGetItem")
        return v

    def _node(self, n) -> None:
        out = n.output[0] if n.output else n.name
        if n.op_type == "Constant":
            v = decode_attr(n.attribute[0]) if n.attribute else None
            self.values[out] = v if v is _MONAD else Const(v)
            return
        if not n.op_type.startswith("REF::"):
            raise UnsupportedNetworkError(
                f"{self.source}: node {n.name} calls {n.op_type!r}, which is not a primitive (a sub-graph call); "
                f"quantflow reads flat graphs only")
        prim = self.prims.get(n.op_type[len("REF::"):])
        if prim is None:
            raise UnsupportedNetworkError(f"{self.source}: node {n.name} refers to unknown primitive {n.op_type}")
        op_type = prim.op_type
        ins = list(n.input)
        if op_type == "Load":
            self.values[out] = self.values[ins[0]]
        elif op_type == "Depend":
            self.values[out] = self.values[ins[0]]
        elif op_type == "UpdateState":
            self.values[out] = _MONAD
        elif op_type == "MakeTuple":
            self.values[out] = _Tuple([self.values[i] for i in ins])
        elif op_type == "TupleGetItem":
            self.values[out] = self._get_item(n, self.values[ins[0]], self.values[ins[1]])
        else:
            self._op(n, out, op_type, prim, ins)

    def _get_item(self, n, tup, index):
        i = int(index.value) if isinstance(index, Const) else None
        if i is None:
            raise UnsupportedNetworkError(f"{self.source}: node {n.name}: TupleGetItem with a non-constant index")
        if isinstance(tup, _Tuple):
            return tup.items[i]
        if isinstance(tup, _MultiOutput):
            return tup.node.outputs[i]
        if isinstance(tup, Const) and isinstance(tup.value, tuple):
            return Const(tup.value[i])
        raise UnsupportedNetworkError(f"{self.source}: node {n.name}: TupleGetItem of {tup!r}")

    def _op(self, n, out: str, op_type: str, prim, ins: list[str]) -> None:
        opdef = get_op(op_type, f"{n.name} ({n.domain})" if n.domain else n.name)
        args = [self._arg(i) for i in ins]
        args = [a for a in args if a is not _MONAD]
        prim_attrs = {a.name: decode_attr(a) for a in prim.attribute}
        infos = _shapes(n)
        ctx = MindirNodeContext(self, n.name, op_type, args, prim_attrs, infos)
        inputs, attrs = opdef.from_mindir(ctx)
        if opdef.num_outputs is None:
            outputs = [out]
        else:
            outputs = [f"{out}:{i}" for i in range(opdef.num_outputs(attrs))]
        node = Node(n.name, op_type, list(inputs), outputs, attrs, scope=n.domain)
        for i, name in enumerate(outputs):
            info = infos[i] if i < len(infos) else (infos[0] if infos else None)
            if info is None:
                raise UnsupportedNetworkError(f"node {n.name} ({op_type}): MindSpore recorded no output shape")
            self.tensors[name] = info
        if node.inputs and all(i in self.initializers for i in node.inputs):
            # computed from constants alone (a YOLO head's anchor grid and strides): its value, once
            for name, value in zip(outputs, constant_outputs(node, self.initializers, self.tensors)):
                self.initializers[name] = value
                del self.tensors[name]
        else:
            self.nodes.append(node)
        if opdef.num_outputs is None:
            self.values[out] = out
        else:
            self.values[out] = _MultiOutput(node)
            if ctx.used_outputs is not None:
                self.restricted[node.name] = (node, ctx.used_outputs)


def read_mindir(path: Path | str) -> Graph:
    """Read a MINDIR file into the graph IR (plumbing resolved, parameters as NumPy arrays)."""
    path = Path(path)
    if not path.is_file():
        raise UnsupportedNetworkError(f"MindIR file not found: {path}")
    model = _pb().ModelProto()
    try:
        model.ParseFromString(path.read_bytes())
    except Exception as err:  # protobuf's DecodeError
        raise UnsupportedNetworkError(f"{path} is not a readable MindIR file: {err}") from None
    if not model.graph.input or not model.graph.node:  # an empty file (or another protobuf) parses to no graph
        raise UnsupportedNetworkError(f"{path} is not a readable MindIR file: it holds no graph with an input")
    _canonical_names(model)
    return _Reader(model, str(path)).read()


def _canonical_names(model) -> None:
    """Rename the graph's values so that the same network always reads into the same IR, whatever the
    MindSpore process did before exporting it.  MindSpore's value names carry process-wide counters
    ("105_1_..._construct_17:CNode_20$x:5" in a fresh process, "1029_925_..._construct_76:CNode_87..."
    after training in the same one) and list their "$" parts in varying order.  Parameters and graph
    inputs keep their own names ("features.0.weight", "x"); the value of the k-th node becomes "vk"
    ("vk_j" for its j-th of several outputs), and so does the node's name.  Layer scopes are untouched."""
    g = model.graph
    prefix = g.name + ":"
    rename = {}
    for v in [*g.parameter, *g.input]:
        rename[v.name] = v.name[len(prefix):] if v.name.startswith(prefix) else v.name
    for k, n in enumerate(g.node):
        for j, o in enumerate(n.output):
            rename[o] = f"v{k}" if len(n.output) == 1 else f"v{k}_{j}"
        if not n.output:
            rename.setdefault(n.name, f"v{k}")
    for v in [*g.parameter, *g.input, *g.output]:
        v.name = rename.get(v.name, v.name)
    for k, n in enumerate(g.node):
        n.name = rename.get(n.output[0] if n.output else n.name, n.name)
        n.input[:] = [rename.get(i, i) for i in n.input]
        n.output[:] = [rename.get(o, o) for o in n.output]

