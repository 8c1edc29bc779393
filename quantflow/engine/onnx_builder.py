"""A small writer of ONNX graphs: nodes, constants and fresh tensor names.

The op registry lowers every IR op through it; the float engine and the INT8 emulator build
their onnxruntime graphs with it, at opset 17; the Ascend deploy graph is written at opset 13
(what atc reads), where the lowerings decompose the newer ops (HardSwish, LayerNormalization).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
DEVICE_OPSET = 13   # the Ascend deploy graph, and the INT8 emulation that mirrors it op for op

_ONNX_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "float64": TensorProto.DOUBLE,
               "int32": TensorProto.INT32, "int64": TensorProto.INT64, "int8": TensorProto.INT8,
               "uint8": TensorProto.UINT8, "bool": TensorProto.BOOL}


def onnx_type(dtype: str) -> int:
    return _ONNX_TYPES[str(np.dtype(dtype))]


def graph_inputs(model: onnx.ModelProto) -> list:
    """The inputs of an ONNX model that are fed, in its order: not its initializers (models of IR version < 4
    list those as inputs too)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


class OnnxBuilder:
    def __init__(self, name: str = "quantflow", opset: int = OPSET, target: str = "compute", taken=()):
        """``target``: "compute" lowers every op to what it computes (Ascend quantization operators
        included, as their arithmetic); "device" keeps AscendQuant/AscendDequant and the int8 cube as
        the deploy operators atc compiles.  ``taken``: names fresh() must not return (the IR's own
        tensor names, which the lowerings write as they are)."""
        self.name, self.opset, self.target = name, opset, target
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, np.ndarray] = {}
        self._taken = set(taken)
        self._count = 0

    def fresh(self, hint: str) -> str:
        """A tensor or node name used nowhere else in the model."""
        while True:
            self._count += 1
            name = f"{hint}__{self._count}"
            if name not in self._taken:
                return name

    def const(self, value, hint: str = "const", dtype=None) -> str:
        arr = np.asarray(value, dtype=dtype)
        if arr.dtype == np.float64 and dtype is None:
            arr = arr.astype(np.float32)
        name = self.fresh(hint)
        self.initializers[name] = arr
        return name

    def initializer(self, name: str, value: np.ndarray) -> str:
        self.initializers[name] = np.asarray(value)
        return name

    def add(self, op_type: str, inputs: list[str], outputs: list[str] | str | None = None, **attrs) -> str | list[str]:
        """Append a node; returns its output name (or names, when several were asked for)."""
        single = outputs is None or isinstance(outputs, str)
        outs = [outputs] if isinstance(outputs, str) else (outputs or [self.fresh(op_type.lower())])
        name = attrs.pop("name", None) or self.fresh(op_type)
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0] if single else outs

    def model(self, inputs: list[tuple[str, tuple, str]], outputs: list[tuple[str, tuple, str]]) -> onnx.ModelProto:
        """``inputs`` and ``outputs``: (name, shape, dtype)."""
        graph = helper.make_graph(
            self.nodes, self.name,
            [helper.make_tensor_value_info(n, onnx_type(d), list(s)) for n, s, d in inputs],
            [helper.make_tensor_value_info(n, onnx_type(d), list(s)) for n, s, d in outputs],
            [numpy_helper.from_array(np.ascontiguousarray(v), k) for k, v in self.initializers.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name="quantflow")
        model.ir_version = 8
        return model
