"""onnxruntime sessions, and ``Runner``: an ONNX model of an IR graph run over any number of samples.

The IR is static in shape (MindSpore fixes the batch size at export), so inputs are cut into chunks of the
graph's batch size and the last chunk is padded.  A graph of batch 1 in a process that set no thread count (the
build process; worker processes set their share, ``THREADS``) runs its chunks one per core at once, on a session
of one onnxruntime thread: at one sample per run onnxruntime's threads share a layer's work poorly, and each
chunk's output is the same whatever the threads.  ``float_runner`` runs the IR's float32 lowering;
``constant_outputs`` computes a node on constant inputs once (the MindIR front-end folds constants with it).
"""
from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx

from ..data.extra_inputs import batch_of
from ..errors import UnsupportedNetworkError
from ..ir import Graph, Node
from ..ops import get as get_op
from .lowering import lower
from .onnx_builder import OnnxBuilder, onnx_type


# onnxruntime threads per session; None: onnxruntime's default (one per core).  A worker process that
# shares the machine with others sets its share (quantflow.engine.shard)
THREADS: int | None = None
MAX_LANES = 8   # images at once at batch 1: each holds its own intermediate buffers (tens of MB for ResNet-18)


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def session(model: onnx.ModelProto, optimize: bool = True, keeps=None, threads: int | None = None):
    """An onnxruntime CPU session of ``threads`` threads (default ``THREADS``).  ``keeps(optimized_model) ->
    bool``, when given, vets onnxruntime's graph optimizations: where it returns False the session runs the graph
    unoptimized."""
    import onnxruntime as ort

    threads = threads or THREADS

    def make(level, saved: str | None = None):
        opts = ort.SessionOptions()
        opts.graph_optimization_level = level
        opts.log_severity_level = 3
        if threads:
            opts.intra_op_num_threads = threads
        if saved:
            opts.optimized_model_filepath = saved
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])

    if not optimize:
        return make(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    if keeps is None:
        return make(ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    with tempfile.TemporaryDirectory() as tmp:
        saved = os.path.join(tmp, "optimized.onnx")
        sess = make(ort.GraphOptimizationLevel.ORT_ENABLE_ALL, saved)
        if keeps(onnx.load(saved)):
            return sess
    return make(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)


class Runner:
    """Runs an ONNX model of an IR graph over any number of samples, in chunks of the graph's batch size."""

    def __init__(self, model: onnx.ModelProto, input_name: str | list[str], batch: int, optimize: bool = True,
                 keeps=None, input_dtype=np.float32, fixed: dict[str, np.ndarray] | None = None):
        """``input_name``: the model's input, or its inputs (then ``run`` takes a dict of arrays).  ``fixed``: the
        model's other inputs, each with the value every sample is fed with (``Graph.fixed_inputs``), fed by
        ``run`` where not given."""
        import onnxruntime as ort

        # chunks run at once, one per core, each on one onnxruntime thread (module doc); else one at a time
        self.lanes = min(cores(), MAX_LANES) if THREADS is None and batch == 1 else 1
        self.sess = session(model, optimize, keeps, threads=1 if self.lanes > 1 else None)
        self.optimized = (self.sess.get_session_options().graph_optimization_level
                          != ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        self.input_name, self.batch, self.input_dtype = input_name, batch, input_dtype
        self.fixed = dict(fixed or {})
        self.output_names = [o.name for o in self.sess.get_outputs()]

    def run(self, x, outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        """``x``: the samples (an array), or for a multi-input model a dict input name -> array, every array
        holding the same number of samples."""
        names = list(dict.fromkeys(outputs or self.output_names))  # each once
        feeds = x if isinstance(x, dict) else {self.input_name: x}
        feeds = {k: np.ascontiguousarray(v, self.input_dtype) for k, v in feeds.items()}
        n = len(next(iter(feeds.values())))
        feeds.update({k: np.ascontiguousarray(batch_of(v, n), self.input_dtype)
                      for k, v in self.fixed.items() if k not in feeds})
        parts: dict[str, list[np.ndarray]] = {k: [] for k in names}
        chunks, reals = [], []
        for s in range(0, n, self.batch):
            chunk = {k: v[s:s + self.batch] for k, v in feeds.items()}
            real = len(next(iter(chunk.values())))
            if real < self.batch:
                chunk = {k: np.concatenate([v, np.zeros((self.batch - real,) + v.shape[1:], v.dtype)])
                         for k, v in chunk.items()}
            chunks.append(chunk)
            reals.append(real)
        if self.lanes > 1 and len(chunks) > 1:
            with ThreadPoolExecutor(min(self.lanes, len(chunks))) as pool:
                results = list(pool.map(lambda c: self.sess.run(names, c), chunks))
        else:
            results = [self.sess.run(names, c) for c in chunks]
        for real, result in zip(reals, results):
            for k, v in zip(names, result):
                parts[k].append(v[:real] if v.ndim and v.shape[0] == self.batch else v)
        return {k: np.concatenate(v) if v and v[0].ndim else (v[0] if v else None) for k, v in parts.items()}


def float_runner(graph: Graph, extra_outputs: list[str] = ()) -> Runner:
    """The IR's float32 lowering, run on the images (its image input) with its other inputs' values fed
    (``Graph.fixed_inputs``)."""
    images = [i for i in graph.inputs if i not in graph.fixed_inputs]
    if len(images) != 1:
        raise UnsupportedNetworkError(
            f"network {graph.name} has {len(images)} inputs ({', '.join(images)}) with no value configured; quantflow "
            f"feeds the images to one and takes every other input's value from [model.inputs] (ONNX models)")
    inp = images[0]
    return Runner(lower(graph, "float32", extra_outputs=extra_outputs), inp, graph.tensors[inp].shape[0],
                  fixed=graph.fixed_inputs)


def constant_outputs(node: Node, values: dict[str, np.ndarray], infos: dict) -> list[np.ndarray]:
    """The outputs of IR ``node`` whose inputs are all in ``values`` (constants), computed once through its
    float32 lowering; ``infos``: the IR's TensorInfo of each output."""
    b = OnnxBuilder(f"{node.name}_constant", taken=set(node.inputs) | set(node.outputs))
    for i in node.inputs:
        b.initializer(i, values[i])
    get_op(node.op, node.name).to_onnx(node, b)
    model = b.model([], [])
    # the element types onnx infers from the constants (MindSpore records no dtype for some nodes' outputs)
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    for o in node.outputs:
        if o in inferred and inferred[o].type.tensor_type.elem_type:
            model.graph.output.append(inferred[o])
        else:
            model.graph.output.append(onnx.helper.make_tensor_value_info(o, onnx_type(infos[o].dtype), None))
    return [np.asarray(v) for v in session(model, optimize=False).run(list(node.outputs), {})]
