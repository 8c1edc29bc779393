"""The op registry: what every IR op means, in one place.

An ``OpDef`` owns one op type (named as the MindIR primitive): how its MindIR inputs and
primitive attributes become the IR node's tensor inputs and normalized attributes
(``from_mindir``), what it computes, written as ONNX nodes (``to_onnx``) so that the float
engine and the INT8 emulator run it with onnxruntime, and how a MindSpore Cell writes it
(``to_mindspore``, for the deploy network).  Stages never branch on op types
themselves; they ask the registry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UnsupportedNetworkError

_REGISTRY: dict[str, "OpDef"] = {}


@dataclass(frozen=True)
class Const:
    """A constant MindIR input (a scalar, tuple or array), as opposed to a tensor name."""
    value: Any


@dataclass(frozen=True)
class TensorList:
    """A tuple of tensors built with MakeTuple (Concat's input)."""
    names: tuple[str, ...]


@dataclass(frozen=True)
class OpDef:
    name: str
    from_mindir: Callable        # (ctx: MindirNodeContext) -> (tensor inputs, attrs)
    to_onnx: Callable            # (node, builder) -> None
    num_outputs: Callable | None = None   # (attrs) -> int, for ops with tuple outputs
    quantizable: bool = False    # Ascend INT8 scheme quantizes it (Conv2D, MatMul with constant weights)
    exact_in_fp16: bool = True   # float32 compute then one float16 rounding == IEEE float16 result
    rounds_itself: bool = False  # its lowering states the device's roundings itself (Quant, Dequant)
    to_mindspore: Callable | None = None  # (node, MindSporeWriter) -> Python expression of the op in a Cell


def register(op: OpDef) -> OpDef:
    if op.name in _REGISTRY:
        raise ValueError(f"op {op.name} registered twice")
    _REGISTRY[op.name] = op
    return op


def get(op_type: str, node_name: str = "?") -> OpDef:
    from . import load_all  # noqa: F401  (the op modules register themselves on import)
    load_all()
    try:
        return _REGISTRY[op_type]
    except KeyError:
        raise UnsupportedNetworkError(
            f"unsupported op {op_type!r} at node {node_name}: quantflow cannot run or quantize it "
            f"(supported: {', '.join(sorted(_REGISTRY))})") from None


def supported() -> list[str]:
    from . import load_all
    load_all()
    return sorted(_REGISTRY)
