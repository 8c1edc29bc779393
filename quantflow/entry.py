"""``module:callable`` entry points of the configuration (model.entry, train.entry, normalization.reference)."""
from __future__ import annotations

import importlib

from .errors import ConfigError


def load_entry(entry: str, field: str):
    """The callable ``entry`` names; a ConfigError naming ``field`` when it cannot be imported or called."""
    module_name, _, attr = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # ImportError, or whatever the module itself raises while it is imported
        raise ConfigError(f"{field}: cannot import module {module_name!r}: {type(err).__name__}: {err}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{field}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{field}: {entry!r} is not callable")
    return obj
