"""What an op's ``to_mindspore`` (``quantflow.ops.registry``) writes into: the source of one MindSpore Cell made
from an IR graph, its inputs as expressions and places for primitives and parameters.  The deploy network
(``quantflow.backends.deploy_mindspore``) and the fake-quant network for retraining
(``quantflow.quantization.qat``) are both written with it."""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedNetworkError
from ..ir import Graph, Node


class MindSporeWriter:
    """What an op's ``to_mindspore`` sees: its inputs as expressions, and places for primitives/parameters."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.init_lines: list[str] = []
        self.arrays: dict[str, np.ndarray] = {}
        self.values: dict[str, str] = {}
        self._params: dict[str, str] = {}
        self._producers, self._consumers = graph.producer(), graph.consumers()

    def prim(self, source: str) -> str:
        """Create ``source`` (a primitive or Cell) in __init__; returns its attribute reference."""
        name = f"p{len(self.init_lines)}"
        self.init_lines.append(f"self.{name} = {source}")
        return f"self.{name}"

    def param(self, array: np.ndarray) -> str:
        key = f"w{len(self.arrays)}"
        self.arrays[key] = np.ascontiguousarray(array)
        self.init_lines.append(f"self.{key} = Parameter(Tensor(arrays[{key!r}]), name={key!r}, requires_grad=False)")
        return f"self.{key}"

    def x(self, node: Node, i: int, keep_float32: bool = False) -> str:
        """Input ``i`` of ``node``: a value computed earlier, or a parameter (float ones in float16)."""
        name = node.inputs[i]
        if name in self.values:
            return self.values[name]
        if name not in self.graph.initializers:
            raise UnsupportedNetworkError(f"node {node.label}: input {name} is not defined")
        key = (name, keep_float32)
        if key not in self._params:
            v = self.graph.initializers[name]
            self._params[key] = self.param(v.astype(np.float16) if v.dtype == np.float32 and not keep_float32 else v)
        return self._params[key]

    def array(self, node: Node, i: int) -> np.ndarray:
        return self.graph.initializers[node.inputs[i]]

    def producer_of(self, tensor: str) -> Node:
        return self._producers[tensor]

    def reader_of(self, tensor: str) -> Node:
        """The one node reading ``tensor`` (an AscendQuant's int8 output has exactly one reader, its cube)."""
        readers = self._consumers.get(tensor, [])
        if len(readers) != 1:
            raise UnsupportedNetworkError(f"{tensor} is read by {len(readers)} nodes, expected its cube alone")
        return readers[0]
