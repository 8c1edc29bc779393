"""Op registry and the op definitions (one module per family)."""
from .registry import Const, OpDef, TensorList, get, register, supported

_loaded = False


def load_all() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        from . import activation, arith, deconv, layout, nn, quant, reduce, rnn  # noqa: F401


__all__ = ["Const", "OpDef", "TensorList", "get", "register", "supported", "load_all"]
