"""The graph IR.

A ``Graph`` is a list of ``Node``s in topological order over named tensors.  A tensor name is
a graph input, an initializer (a parameter or constant held as a NumPy array) or the output of
exactly one node.  ``Node.op`` names an entry of the op registry (``quantflow.ops``), which owns
what the op computes; ``Node.attrs`` hold that op's normalized attributes (plain Python values).
``Node.name`` is the node name in the source model (the MindIR node name), kept so that every
artifact can point back at the layer it came from.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass
class Node:
    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)
    scope: str = ""          # readable layer path from the source model (e.g. Default/c1-Conv2d/Conv2D-op0)

    @property
    def label(self) -> str:
        return self.scope or self.name


@dataclass
class Graph:
    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    initializers: dict[str, np.ndarray]
    tensors: dict[str, TensorInfo]       # shape and dtype of every graph input and node output
    name: str = "graph"
    # inputs other than the image, with the value each image is fed with (its shape without the batch axis):
    # kept as inputs (the deploy graph's too), fed by every run (engine.runner.Runner), e.g. a detector's
    # scale_factor (quantflow.data.extra_inputs)
    fixed_inputs: dict[str, np.ndarray] = field(default_factory=dict)
    # outputs of the source model that depend on no input (a detector's constant box_scale), by their name in the
    # model file: not among ``outputs`` (nothing runs, calibrates or gates them); the graphs quantflow writes for
    # deployment keep them, after the others (``engine.lowering.lower(constant_outputs=True)``)
    constant_outputs: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def image_input(self) -> str:
        """The input the images are fed to: the first one not in ``fixed_inputs``."""
        return next(i for i in self.inputs if i not in self.fixed_inputs)

    def producer(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                out.setdefault(i, []).append(n)
        return out

    def downstream(self, names) -> list[Node]:
        """The nodes computed, directly or through others, from the tensors ``names``, in graph order."""
        reached, out = set(names), []
        for n in self.nodes:   # topological order: a node's inputs are made before it
            if any(i in reached for i in n.inputs):
                out.append(n)
                reached.update(n.outputs)
        return out

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.initializers:
            return tuple(self.initializers[name].shape)
        return self.tensors[name].shape

    def names(self) -> set[str]:
        """Every name in use: tensors, initializers and nodes."""
        return (set(self.inputs) | set(self.initializers) | set(self.tensors)
                | {o for n in self.nodes for o in n.outputs} | {n.name for n in self.nodes})

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def check(self) -> None:
        """Every input defined before use, every tensor produced once, outputs defined."""
        defined = set(self.inputs) | set(self.initializers)
        for n in self.nodes:
            for i in n.inputs:
                if i not in defined:
                    raise ValueError(f"node {n.name} ({n.op}) reads {i!r} before it is defined")
            for o in n.outputs:
                if o in defined:
                    raise ValueError(f"tensor {o!r} is defined twice (again by node {n.name})")
                defined.add(o)
        for o in self.outputs:
            if o not in defined:
                raise ValueError(f"graph output {o!r} is not produced by any node")

    def prune(self) -> None:
        """Drop nodes and initializers the outputs do not depend on."""
        needed = set(self.outputs)
        kept = []
        for n in reversed(self.nodes):
            if any(o in needed for o in n.outputs):
                kept.append(n)
                needed.update(n.inputs)
        self.nodes = kept[::-1]
        self.initializers = {k: v for k, v in self.initializers.items() if k in needed}

    def suffix(self, start: int) -> "Graph":
        """The graph from node ``start`` on: its inputs are the tensors those nodes read that earlier nodes
        (or the graph's inputs) produce, in order of first use; initializers, tensors and outputs as here."""
        nodes = self.nodes[start:]
        made = {o for n in nodes for o in n.outputs}
        inputs = list(dict.fromkeys(i for n in nodes for i in n.inputs
                                    if i and i not in made and i not in self.initializers))
        inputs += [o for o in self.outputs if o not in made and o not in inputs]
        used = {i for n in nodes for i in n.inputs}
        return Graph(list(nodes), inputs, list(self.outputs),
                     {k: v for k, v in self.initializers.items() if k in used},
                     {k: t for k, t in self.tensors.items() if k in made or k in inputs}, self.name,
                     {k: v for k, v in self.fixed_inputs.items() if k in inputs}, dict(self.constant_outputs))

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return dict(sorted(counts.items()))
