"""Graph passes that prepare the IR for the Ascend INT8 scheme.

``fold_for_quantization`` returns a new graph in which

- a BatchNorm whose input is only read by it, and is a Conv2D output (or a Conv2D + BiasAdd
  output), is folded into that convolution's weights and bias;
- a BiasAdd on a Conv2D / MatMul output (read only by the BiasAdd) becomes the op's third input.

Folding is done in float64 and stored as float32.  The folded graph computes what the original
does up to float32 rounding; the quantizer and the emulator work on it.
"""
from __future__ import annotations

import copy

import numpy as np

from ..ir import Graph, Node

_BIASED = ("Conv2D", "MatMul")


def _single_reader(g: Graph, tensor: str, consumers) -> Node | None:
    readers = consumers.get(tensor, [])
    if len(readers) != 1 or tensor in g.outputs:
        return None
    return readers[0]


def _bias_axis_ok(node: Node, bias_add: Node) -> bool:
    if node.op == "Conv2D":
        return bias_add.attrs["axis"] == 1
    return bias_add.attrs["rank"] == 2 and node.attrs["rank_a"] == 2


def _fuse_bias(g: Graph) -> None:
    consumers, drop = g.consumers(), set()
    for node in g.nodes:
        if node.op not in _BIASED or len(node.inputs) != 2 or node.inputs[1] not in g.initializers:
            continue
        nxt = _single_reader(g, node.outputs[0], consumers)
        if nxt is None or nxt.op != "BiasAdd" or nxt.inputs[0] != node.outputs[0] \
                or nxt.inputs[1] not in g.initializers or not _bias_axis_ok(node, nxt):
            continue
        node.inputs.append(nxt.inputs[1])
        node.outputs = list(nxt.outputs)
        drop.add(id(nxt))
    g.nodes = [n for n in g.nodes if id(n) not in drop]


def _fold_bn(g: Graph) -> None:
    consumers, drop = g.consumers(), set()
    for node in g.nodes:
        if node.op != "Conv2D" or node.inputs[1] not in g.initializers:
            continue
        bn = _single_reader(g, node.outputs[0], consumers)
        if bn is None or bn.op != "BatchNorm" or bn.inputs[0] != node.outputs[0] \
                or not all(i in g.initializers for i in bn.inputs[1:5]):
            continue
        gamma, beta, mean, var = (g.initializers[i].astype(np.float64) for i in bn.inputs[1:5])
        k = gamma / np.sqrt(var + bn.attrs["epsilon"])
        w = g.initializers[node.inputs[1]].astype(np.float64)
        b = g.initializers[node.inputs[2]].astype(np.float64) if len(node.inputs) == 3 else np.zeros(w.shape[0])
        wname, bname = f"{node.name}:folded_weight", f"{node.name}:folded_bias"
        g.initializers[wname] = (w * k.reshape(-1, 1, 1, 1)).astype(np.float32)
        g.initializers[bname] = ((b - mean) * k + beta).astype(np.float32)
        node.inputs = [node.inputs[0], wname, bname]
        node.outputs = [bn.outputs[0]]
        node.attrs = {**node.attrs, "folded": bn.name}
        drop.add(id(bn))
    g.nodes = [n for n in g.nodes if id(n) not in drop]


def fold_for_quantization(graph: Graph) -> Graph:
    g = copy.copy(graph)
    g.nodes = [copy.deepcopy(n) for n in graph.nodes]
    g.initializers = dict(graph.initializers)
    _fuse_bias(g)
    _fold_bn(g)
    _fuse_bias(g)  # a BiasAdd after a folded BatchNorm
    g.prune()
    g.check()
    return g
