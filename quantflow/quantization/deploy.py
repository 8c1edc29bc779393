"""The deploy graph in the IR: the Ascend quantization operators made explicit.

``quantized_graph`` rewrites every quantized Conv2D / MatMul of the (BatchNorm-folded) graph as

    Quant(scale = float32(1/scale_d), offset = offset_d)                         float -> int8
    Conv2D / MatMul(int8 weight, int32 bias; offset_x = offset_d)                int8 -> int32
    Dequant(deq_scale: uint64 per channel, relu_flag)                            int32 -> float16

so that one graph is what the emulator runs, what deploy.onnx and the deploy MindIR are written
from, and what the MindIR front-end reads back from a deploy MindIR.  The float weights the recovery rewrote
(``QuantParams.float_weights``, e.g. cross-layer equalization) are put into the graph first.
"""
from __future__ import annotations

import copy

from ..ir import Graph, Node, TensorInfo
from .qparams import QuantParams
from .scheme import deq_scale_uint64, quant_scale


def quantized_graph(graph: Graph, qparams: QuantParams) -> Graph:
    graph = qparams.apply(graph)
    qmap = qparams.by_node()
    missing = [n for n in qmap if not any(x.name == n for x in graph.nodes)]
    if missing:
        raise ValueError(f"quantization parameters name node(s) not in the graph: {', '.join(missing)}")
    g = copy.copy(graph)
    g.initializers, g.tensors, g.nodes = dict(graph.initializers), dict(graph.tensors), []
    for node in graph.nodes:
        q = qmap.get(node.name)
        if q is None:
            g.nodes.append(copy.deepcopy(node))
            continue
        x, out = node.inputs[0], node.outputs[0]
        names = {k: f"{node.name}:{k}" for k in ("q", "acc", "weight_int8", "bias_int32", "deq_scale")}
        g.initializers[names["weight_int8"]] = q.weight
        g.initializers[names["bias_int32"]] = q.bias
        g.initializers[names["deq_scale"]] = deq_scale_uint64(q.deq_scale)
        g.tensors[names["q"]] = TensorInfo(graph.shape(x), "int8")
        g.tensors[names["acc"]] = TensorInfo(graph.shape(out), "int32")
        cube_attrs = {**node.attrs, "offset_x": q.offset_d, "channel_axis": q.channel_axis,
                      "out_rank": len(graph.shape(out))}
        cube_attrs.pop("folded", None)
        g.nodes += [
            Node(f"{node.name}:quant", "Quant", [x], [names["q"]],
                 {"scale": float(quant_scale(q.scale_d)), "offset": float(q.offset_d)}, scope=f"{q.scope}/quant"),
            Node(node.name, node.op, [names["q"], names["weight_int8"], names["bias_int32"]], [names["acc"]],
                 cube_attrs, scope=q.scope),
            Node(f"{node.name}:dequant", "Dequant", [names["acc"], names["deq_scale"]], [out],
                 {"relu_flag": q.relu, "rank": len(graph.shape(out))}, scope=f"{q.scope}/dequant"),
        ]
    g.prune()
    g.check()
    return g
