"""Which ops a configuration pattern names (quantization.skip / fallback / per-layer method overrides)."""
from __future__ import annotations

import pytest

from quantflow.ir import Node
from quantflow.quantization.selection import first_match, matches, unmatched


def node(name, op, scope=""):
    return Node(name, op, ["x", "w"], [name + "_out"], {}, scope=scope)


CONV1 = node("Conv2D-op12", "Conv2D", "Default/features-SequentialCell/0-Conv2dBnAct/conv-Conv2d/Conv2D-op12")
CONV2 = node("Conv2D-op40", "Conv2D", "Default/features-SequentialCell/3-Conv2dBnAct/conv-Conv2d/Conv2D-op40")
DENSE = node("MatMul-op99", "MatMul", "Default/head-Dense/MatMul-op99")
BARE = node("conv_plain", "Conv2D")   # no scope: its label is its name
NODES = [CONV1, CONV2, DENSE, BARE]


def test_label_is_the_scope_or_else_the_name():
    assert CONV1.label == CONV1.scope and BARE.label == "conv_plain"


def test_exact_node_name():
    assert matches(CONV1, "Conv2D-op12")
    assert not matches(CONV2, "Conv2D-op12")
    assert not matches(CONV1, "Conv2D-op1")   # no prefix match without a wildcard


def test_glob_on_the_name():
    assert [n.name for n in NODES if matches(n, "Conv2D-op[14]*")] == ["Conv2D-op12", "Conv2D-op40"]
    assert [n.name for n in NODES if matches(n, "*-op99")] == ["MatMul-op99"]
    assert [n.name for n in NODES if matches(n, "conv_?lain")] == ["conv_plain"]


def test_glob_on_the_scope():
    assert [n.name for n in NODES if matches(n, "Default/head-*")] == ["MatMul-op99"]
    assert [n.name for n in NODES if matches(n, "*/3-Conv2dBnAct/*")] == ["Conv2D-op40"]
    assert [n.name for n in NODES if matches(n, "Default/features-SequentialCell/*")] == ["Conv2D-op12",
                                                                                           "Conv2D-op40"]
    # the full scope, exactly
    assert matches(DENSE, "Default/head-Dense/MatMul-op99")
    # the scope is matched whole: a part of it is no match without wildcards
    assert not matches(DENSE, "head-Dense")


def test_op_type():
    assert [n.name for n in NODES if matches(n, "MatMul")] == ["MatMul-op99"]
    assert [n.name for n in NODES if matches(n, "Conv2D")] == ["Conv2D-op12", "Conv2D-op40", "conv_plain"]


def test_case_sensitive_and_no_match():
    assert not matches(DENSE, "matmul")
    assert not matches(CONV1, "default/*")
    assert not any(matches(n, "Default/backbone/*") for n in NODES)
    assert not any(matches(n, "") for n in NODES)


def test_first_match_returns_the_first_pattern_in_order():
    pats = ["Default/head-*", "Conv2D", "*op12"]
    assert first_match(CONV1, pats) == "Conv2D"
    assert first_match(CONV1, ["*op12", "Conv2D"]) == "*op12"
    assert first_match(DENSE, pats) == "Default/head-*"
    assert first_match(BARE, pats) == "Conv2D"
    assert first_match(DENSE, ["Conv2D", "nothing*"]) is None
    assert first_match(DENSE, []) is None


def test_first_match_accepts_any_iterable_of_patterns():
    assert first_match(DENSE, (p for p in ["x", "MatMul"])) == "MatMul"


@pytest.mark.parametrize("patterns, expected", [
    (["Conv2D", "MatMul"], []),
    (["Conv2D-op12", "Conv2D-op13", "Default/head-*", "Default/tail-*"], ["Conv2D-op13", "Default/tail-*"]),
    (["conv2d", "*"], ["conv2d"]),
    ([], []),
])
def test_unmatched_names_the_patterns_that_name_no_node(patterns, expected):
    assert unmatched(NODES, patterns) == expected


def test_unmatched_of_no_nodes_is_every_pattern():
    assert unmatched([], ["Conv2D", "*"]) == ["Conv2D", "*"]
