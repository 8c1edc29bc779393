"""``module:callable`` entry points of the configuration (model.entry, train.entry, normalization.reference).

``load_entry`` imports one and returns it wrapped, so that whatever the user's code raises when it is called ends
in one message naming the configuration field, the entry and the line of the user's code that raised, not in a
traceback through quantflow."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import traceback

from .errors import ConfigError, QuantflowError


def raised_at(err: BaseException, near: str | None = None) -> str:
    """Where ``err`` was raised, ``" (at net.py, line 12)"``: the innermost frame in the folder ``near`` (the
    entry's own package: the user's line, not the library's deep inside the call), else the innermost frame; none
    when it was raised calling the entry itself (e.g. with arguments it does not take)."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename != __file__]
    own = [f for f in frames if near and os.path.dirname(os.path.abspath(f.filename)) == near]
    frame = (own or frames or [None])[-1]
    return f" (at {frame.filename}, line {frame.lineno})" if frame else ""


def first_line(err: BaseException) -> str:
    """``"KeyError: 'scale'"``: the exception's type and the first line of its message."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def load_entry(entry: str, field: str):
    """The callable ``entry`` names, wrapped: called, an exception it raises becomes a ConfigError naming ``field``
    (a QuantflowError it raises passes unchanged).  A ConfigError naming ``field`` when it cannot be imported or
    is not callable."""
    module_name, _, attr = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # ImportError, or whatever the module itself raises while it is imported
        raise ConfigError(f"{field} = {entry!r}: cannot import module {module_name!r}: {first_line(err)}"
                          f"{raised_at(err) if not isinstance(err, ImportError) else ''}") from None
    near = os.path.dirname(os.path.abspath(module.__file__)) if getattr(module, "__file__", None) else None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{field} = {entry!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{field} = {entry!r}: {attr!r} is a {type(obj).__name__}, not a callable")

    @functools.wraps(obj)
    def call(*args, **kwargs):
        try:
            return obj(*args, **kwargs)
        except QuantflowError:
            raise
        except Exception as err:  # the user's code failed: say where, without quantflow's frames around it
            raise ConfigError(f"{field} = {entry!r} raised {first_line(err)}{raised_at(err, near)}") from None
    return call


def module_file(entry: str) -> list[str]:
    """The source file of an entry point's module, if it has one (what a stage's key hashes of the user's code) (a missing module: none, the run reports it)."""
    try:
        spec = importlib.util.find_spec(entry.partition(":")[0])
    except Exception:  # a missing parent package raises here (or one that raises on import), not returns None
        return []
    return [spec.origin] if spec is not None and spec.origin and os.path.isfile(spec.origin) else []
