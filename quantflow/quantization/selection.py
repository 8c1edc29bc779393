"""Which ops a configuration pattern names: a node name, a layer scope (glob patterns allowed,
matched with fnmatch, case-sensitive) or an op type."""
from __future__ import annotations

from fnmatch import fnmatchcase

from ..ir import Node


def matches(node: Node, pattern: str) -> bool:
    return pattern == node.op or fnmatchcase(node.name, pattern) or fnmatchcase(node.label, pattern)


def first_match(node: Node, patterns) -> str | None:
    """The first of ``patterns`` naming ``node``, or None."""
    return next((p for p in patterns if matches(node, p)), None)


def unmatched(nodes: list[Node], patterns) -> list[str]:
    """The patterns that name none of ``nodes`` (a typo in the configuration)."""
    return [p for p in patterns if not any(matches(n, p) for n in nodes)]
