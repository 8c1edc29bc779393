"""An ONNX model cut at named tensors (``model.outputs``), and the suppression tail quantflow cuts by default.

A detector exported with its non-maximum suppression (PaddleDetection's ``multiclass_nms3`` through paddle2onnx,
an exporter's ``nms=True``) ends in ``NonMaxSuppression`` and the gathers after it: data-dependent shapes the
static graph IR cannot hold, and the detections' order changes with any score.  The device computes the network up
to the suppression's inputs -- the decoded boxes and the class scores -- and the application suppresses overlaps
on the host.  ``cut`` keeps what the named tensors are computed from (the nodes in their order, the inputs and
initializers they read) and makes those tensors the outputs; ``suppression_tail`` finds the suppression node and
its inputs, which ``quantflow init`` writes as ``model.outputs``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..engine.onnx_builder import graph_inputs
from ..errors import UnsupportedNetworkError

FIELD = "model.outputs"
SUPPRESSION_OPS = ("NonMaxSuppression",)


@dataclass(frozen=True)
class SuppressionTail:
    """A suppression node of the file and what it reads: its boxes and scores inputs, and its IoU and score
    thresholds where the file holds them as constants (None otherwise)."""
    node: str
    boxes: str
    scores: str
    iou: float | None
    score_threshold: float | None


def _constant(graph, name: str):
    """The value of ``name`` where an initializer or a Constant node holds it, else None."""
    from onnx import numpy_helper

    for t in graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    for n in graph.node:
        if n.op_type == "Constant" and list(n.output) == [name]:
            value = next((a for a in n.attribute if a.name == "value"), None)
            return numpy_helper.to_array(value.t) if value is not None else None
    return None


def suppression_tail(model) -> SuppressionTail | None:
    """The file's first ``NonMaxSuppression`` node (``SUPPRESSION_OPS``) and its inputs; None where it has none."""
    g = model.graph
    node = next((n for n in g.node if n.op_type in SUPPRESSION_OPS and n.domain in ("", "ai.onnx")), None)
    if node is None or len(node.input) < 2:
        return None

    def scalar(k: int) -> float | None:
        v = _constant(g, node.input[k]) if k < len(node.input) and node.input[k] else None
        return float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None

    return SuppressionTail(node.name or node.output[0], node.input[0], node.input[1], scalar(3), scalar(4))


def suppression_fix(boxes: str, scores: str) -> str:
    """What to do about a suppression node reading ``boxes`` and ``scores``."""
    return (f"end the network at the suppression's inputs, model.outputs = [\"{boxes}\", \"{scores}\"] (`quantflow "
            f"init` writes it): the device computes the boxes and scores, and the application suppresses overlaps on "
            f"the host")


def _subgraph_reads(node) -> set[str]:
    """Names a node's sub-graphs (If / Loop / Scan bodies) read from the graph around them."""
    from onnx import AttributeProto

    names: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []
        for sub in graphs:
            for n in sub.node:
                names.update(i for i in n.input if i)
                names |= _subgraph_reads(n)
    return names


def cut(model, outputs: Sequence[str], source: str):
    """A copy of ``model`` whose outputs are the tensors ``outputs`` (in that order), holding only the nodes,
    inputs, initializers and value infos they are computed from.  ``source`` names the file in messages."""
    import onnx

    g = model.graph
    producer = {o: k for k, n in enumerate(g.node) for o in n.output if o}
    inits = {t.name for t in g.initializer}
    inputs = [i.name for i in graph_inputs(model)]
    for name in outputs:
        if name not in producer:
            what = "an input of the model" if name in inputs else "a weight" if name in inits else "no tensor of it"
            raise UnsupportedNetworkError(
                f"{source}: {FIELD} names {name!r}, which is {what}: give tensors the model's nodes compute (e.g. "
                f"the inputs of its NonMaxSuppression node)")
    if len(set(outputs)) != len(outputs):
        raise UnsupportedNetworkError(f"{source}: {FIELD} names a tensor twice: {list(outputs)}")
    needed_nodes: set[int] = set()
    needed: set[str] = set()
    stack = list(outputs)
    while stack:
        t = stack.pop()
        if t in needed:
            continue
        needed.add(t)
        k = producer.get(t)
        if k is not None and k not in needed_nodes:
            needed_nodes.add(k)
            node = g.node[k]
            stack.extend(i for i in node.input if i)
            stack.extend(_subgraph_reads(node))
    declared = {v.name: v for v in list(g.value_info) + list(g.output)}
    typed = {}
    if any(name not in declared for name in outputs):
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        typed = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    og = out.graph
    del og.node[:], og.input[:], og.output[:], og.value_info[:], og.initializer[:]
    og.node.extend(n for k, n in enumerate(g.node) if k in needed_nodes)
    og.input.extend(i for i in g.input if i.name in needed)
    og.initializer.extend(t for t in g.initializer if t.name in needed)
    og.value_info.extend(v for v in g.value_info if v.name in needed and v.name not in outputs)
    for name in outputs:
        vi = declared.get(name) or typed.get(name)
        og.output.append(vi if vi is not None else onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                                                                      None))
    return out
