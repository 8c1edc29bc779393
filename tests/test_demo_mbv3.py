"""The MobileNetV3-small-style demo (quantflow/demo/mbv3.py, examples/mobilenet_v3_small): its shipped network
read into the graph IR holds what makes MobileNetV3 hard for INT8, and computes what MindSpore computes.  (That
its checkpoint loads and its training record holds: tests/test_demo_checkpoints.py.)"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from support.project import REPO

from quantflow.backends.export import export_mindir
from quantflow.config import load_config
from quantflow.data.images import load_images, scan_class_folders
from quantflow.demo.data import preprocess_batch
from quantflow.engine.runner import float_runner
from quantflow.frontends.mindir import read_mindir
from quantflow.frontends.network import build_network

CONFIG = REPO / "examples" / "mobilenet_v3_small" / "quantflow.toml"


def test_the_shipped_network_is_mobilenet_v3_small_style_in_the_graph_ir(tmp_path):
    cfg = load_config(CONFIG)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = build_network(cfg)
    graph = read_mindir(export_mindir(net, (1, 3, 32, 32), tmp_path / "mbv3.mindir"))
    ops = graph.op_counts()
    squeeze_excitations = sum(se for _, _, _, se, _, _ in net.BLOCKS)
    # hard-swish activations, a hard-sigmoid and a channel Mul per squeeze-excitation, residual Adds
    assert ops["HSwish"] >= 10 and ops["HSigmoid"] == ops["Mul"] == squeeze_excitations and ops["Add"] >= 6
    convs = [n for n in graph.nodes if n.op == "Conv2D"]
    depthwise = [n for n in convs if n.attrs.get("group", 1) > 1]
    assert len(depthwise) == len(net.BLOCKS)
    assert sum(1 for n in depthwise if graph.shape(n.inputs[1])[2:] == (5, 5)) == sum(k == 5 for k, *_ in net.BLOCKS)
    # the IR computes what MindSpore computes on held-out digits
    items = scan_class_folders(cfg.path(cfg.evaluation.data_dir), 10)[::40]
    x = preprocess_batch(load_images([i.path for i in items], 3, 32, 32))
    want = net(ms.Tensor(x)).asnumpy()
    got = np.concatenate([float_runner(graph).run(x[k:k + 1])[graph.outputs[0]] for k in range(len(x))])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
