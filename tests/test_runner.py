"""engine.runner.Runner: samples cut into chunks of the graph's batch (the last one padded), and at batch 1 in a
process that set no thread count, the chunks run at once on a one-thread session: outputs in sample order, equal
to each sample run alone and to numpy."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantflow.engine import runner
from quantflow.engine.runner import Runner

RNG = np.random.default_rng(0)
W = RNG.normal(size=(6, 4)).astype(np.float32)
B = RNG.normal(size=(4,)).astype(np.float32)


def dense_relu(batch: int, inputs: int = 1) -> onnx.ModelProto:
    """y = relu(sum of the inputs @ W + B), for ``batch`` samples of 6 values; inputs x0, x1, ..."""
    names = [f"x{i}" for i in range(inputs)]
    nodes, total = [], names[0]
    for i, n in enumerate(names[1:], 1):
        nodes.append(helper.make_node("Add", [total, n], [f"s{i}"]))
        total = f"s{i}"
    nodes += [helper.make_node("MatMul", [total, "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["a"]),
              helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(
        nodes, "dense_relu", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, 6]) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4]),
         helper.make_tensor_value_info("m", TensorProto.FLOAT, [batch, 4])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def alone(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """Each sample through a plain one-thread onnxruntime session on its own."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(["y"], {"x0": x[i:i + 1]})[0] for i in range(len(x))])


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(runner, "cores", lambda: 2)
    monkeypatch.setattr(runner, "THREADS", None)


def test_batch_one_runs_its_chunks_at_once_on_one_thread_sessions_in_sample_order(two_cores):
    model, x = dense_relu(1), RNG.normal(size=(9, 6)).astype(np.float32)
    r = Runner(model, "x0", 1)
    assert r.lanes == 2 and r.sess.get_session_options().intra_op_num_threads == 1
    got = r.run(x)
    assert np.array_equal(got["y"], alone(model, x))
    assert np.allclose(got["y"], np.maximum(x.astype(np.float64) @ W + B, 0), atol=1e-5)
    assert np.array_equal(r.run(x, ["m"])["m"], got["m"]) and list(r.run(x[:1])) == ["y", "m"]


def test_several_inputs_at_batch_one(two_cores):
    model = dense_relu(1, inputs=2)
    x0, x1 = RNG.normal(size=(2, 5, 6)).astype(np.float32)
    got = Runner(model, ["x0", "x1"], 1).run({"x0": x0, "x1": x1})["y"]
    assert np.allclose(got, np.maximum((x0 + x1).astype(np.float64) @ W + B, 0), atol=1e-5)


def test_a_larger_batch_or_a_set_thread_count_runs_one_chunk_at_a_time(two_cores, monkeypatch):
    x = RNG.normal(size=(7, 6)).astype(np.float32)
    r = Runner(dense_relu(3), "x0", 3)   # chunks 3, 3, and 1 padded with zeros
    assert r.lanes == 1
    assert np.allclose(r.run(x)["y"], np.maximum(x.astype(np.float64) @ W + B, 0), atol=1e-5)
    monkeypatch.setattr(runner, "THREADS", 1)   # a worker process's share of the cores (engine.shard)
    r = Runner(dense_relu(1), "x0", 1)
    assert r.lanes == 1 and r.sess.get_session_options().intra_op_num_threads == 1
    assert np.array_equal(r.run(x)["y"], alone(dense_relu(1), x))
