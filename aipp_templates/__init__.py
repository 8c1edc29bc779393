"""The AIPP templates shipped with quantflow (CANN ``aipp_op`` format with ``${...}`` placeholders), installed as
``quantflow.aipp_templates``; ``aipp.template`` may name one of them."""
from __future__ import annotations

from importlib import resources
from pathlib import Path


def shipped() -> list[str]:
    """The names of the shipped templates."""
    return sorted(p.name for p in resources.files(__name__).iterdir() if p.name.endswith(".cfg"))


def path(name: str) -> Path | None:
    """The shipped template called ``name``, or None."""
    p = resources.files(__name__) / name
    return Path(str(p)) if name.endswith(".cfg") and p.is_file() else None
