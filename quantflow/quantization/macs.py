"""Multiply-adds of the quantizable ops (convolutions and matrix products with constant weights: the ops the
device can run in INT8), per image: the device-speed proxy a release trades fidelity against.

An op's count is its output elements per image times the multiply-adds behind each one: ``weight.size /
out_channels`` (a convolution's weight [C_out, C_in / groups, kh, kw]: C_in / groups x kh x kw; a matrix product's
[K, N] or [N, K]: K).  The INT8 share of a build is the INT8 ops' multiply-adds over all quantizable ops'
(``int8_share``): the ops that can never be INT8 (a product of two activations, a pooling) are left out of both,
so a float16-only build reads 0 and an all-INT8 build 1.
"""
from __future__ import annotations

import math

from ..ir.graph import Graph


def op_macs(graph: Graph, node) -> int:
    """Multiply-adds of one quantizable op (``calibrater.quantizable_nodes``) per image."""
    weight = graph.initializers[node.inputs[1]]
    out = graph.shape(node.outputs[0])
    channels = out[1] if node.op == "Conv2D" else out[-1]
    per_image = math.prod(out[1:]) if len(out) > 1 else 1
    return int(per_image * weight.size // max(int(channels), 1))


def macs_by_node(graph: Graph) -> dict[str, int]:
    """Every quantizable op's multiply-adds per image, by node name, in graph order."""
    from .calibrater import quantizable_nodes

    return {n.name: op_macs(graph, n) for n in quantizable_nodes(graph)}


def int8_share(graph: Graph, int8_nodes) -> dict:
    """{"int8_macs", "macs", "share"}: the multiply-adds of the ops ``int8_nodes`` (those in INT8) against all the
    quantizable ops' (``share`` 0 where the network has none)."""
    by_node = macs_by_node(graph)
    total = sum(by_node.values())
    int8 = sum(by_node.get(n, 0) for n in set(int8_nodes))
    return {"int8_macs": int8, "macs": total, "share": int8 / total if total else 0.0}
