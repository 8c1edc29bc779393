"""quantization.skip and quantization.methods: which ops are INT8 and how each range is chosen."""
from types import SimpleNamespace

import numpy as np
import pytest
from quantflow.tasks.calibrate import _check_patterns
from support import nets

from quantflow.errors import ConfigError
from quantflow.frontends.mindir import read_mindir
from quantflow.quantization.calibrater import calibrate, quantizable_nodes
from quantflow.quantization.deploy import quantized_graph
from quantflow.quantization.passes import fold_for_quantization


@pytest.fixture(scope="module")
def residual(tmp_path_factory):
    graph = fold_for_quantization(read_mindir(nets.export(nets.ResidualNet(), tmp_path_factory.mktemp("r") / "r.mindir")))
    x = np.random.default_rng(0).normal(size=(32, 3, 16, 16)).astype(np.float32)
    return graph, [x[:16], x[16:]]


def test_skip_by_op_type_and_by_scope_leaves_those_ops_float(residual):
    graph, batches = residual
    nodes = quantizable_nodes(graph)
    first = nodes[0]
    qp = calibrate(graph, batches, "mse", skip=("MatMul", first.label), rollback_small_channels=False)
    assert [q.node for q in qp.ops] == [n.name for n in nodes if n.op != "MatMul" and n is not first]
    deploy = quantized_graph(graph, qp)
    quant_inputs = {n.inputs[0] for n in deploy.nodes if n.op == "Quant"}
    assert first.inputs[0] not in quant_inputs  # no AscendQuant in front of the skipped layer
    assert not any(n.op == "MatMul" and "offset_x" in n.attrs for n in deploy.nodes)


def test_a_per_layer_method_overrides_the_default(residual):
    graph, batches = residual
    nodes = quantizable_nodes(graph)
    scope_glob = nodes[1].label[:-3] + "*"  # a glob on the layer scope
    qp = calibrate(graph, batches, "percentile", percentile=90.0, overrides={scope_glob: "minmax"},
                   rollback_small_channels=False)
    by_node = {q.node: q for q in qp.ops}
    assert by_node[nodes[1].name].stats["method"] == "minmax"
    assert (by_node[nodes[1].name].stats["lo"], by_node[nodes[1].name].stats["hi"]) == \
        (by_node[nodes[1].name].stats["min"], by_node[nodes[1].name].stats["max"])
    others = [q for q in qp.ops if q.node != nodes[1].name and q.input != nodes[1].inputs[0]]
    assert others and all(q.stats["method"] == "percentile" for q in others)
    assert any(q.stats["hi"] < q.stats["max"] for q in others)  # 90th percentile clips


def test_a_pattern_naming_no_layer_is_a_config_error(residual):
    graph, _ = residual
    cfg = SimpleNamespace(quantization=SimpleNamespace(skip=("Default/nothing*",), methods={}))
    with pytest.raises(ConfigError, match=r"quantization.skip: pattern\(s\) 'Default/nothing\*' name no quantizable op"):
        _check_patterns(quantizable_nodes(graph), cfg)
    cfg = SimpleNamespace(quantization=SimpleNamespace(skip=(), methods={"Conv3D": "mse"}))
    with pytest.raises(ConfigError, match="quantization.methods"):
        _check_patterns(quantizable_nodes(graph), cfg)
