"""A TOML writer for configuration data: the plain values a quantflow.toml holds (strings, numbers, booleans,
lists of them, nested tables), written so that ``tomllib.loads(dumps(d)) == d``.  The standard library reads TOML
but does not write it; a configuration is small and regular enough not to need a package for it."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def dumps(data: dict, header: str = "") -> str:
    """``data`` as TOML text: top-level plain values first, then one ``[table]`` per nested dict (sub-tables as
    ``[table.sub]``).  ``header`` lines come first, each as a comment.  A value TOML cannot hold (None inside a
    list, an object of another type) is a TypeError naming its key."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    body = _table(data, ())
    return "\n".join(lines + ([""] if lines else []) + body).rstrip() + "\n"


def _table(data: dict, path: tuple[str, ...]) -> list[str]:
    out, tables = [], []
    for key, value in data.items():
        if value is None:            # TOML has no null: a key left out takes its default
            continue
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            out.append(f"{_key(key)} = {_value(value, path + (key,))}")
    for key, value in tables:
        sub = path + (key,)
        out += ["", f"[{'.'.join(_key(k) for k in sub)}]"] + _table(value, sub)
    return out


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _value(v, where: tuple[str, ...]) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, (str, Path)):
        # JSON's string escapes are TOML basic-string escapes, except that TOML has no "\/" (json never writes it)
        return json.dumps(str(v), ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x, where) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x, where + (k,))}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(f"{'.'.join(where)}: a {type(v).__name__} cannot be written as TOML")
