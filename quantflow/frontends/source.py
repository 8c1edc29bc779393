"""The configured network, whatever its format: the file that holds it, how it is read into the graph
IR, and the runtime whose output the IR is checked against.

- ``model.onnx``: the ONNX file as given, read by ``onnx_model.read_onnx`` with its input fixed to
  ``model.input_shape`` (N, C, H, W; a channels-last file, ``model.input_layout = "NHWC"``, is read with an
  N, C, H, W input); the reference is onnxruntime running that file unchanged, fed in its own layout.
- ``model.mindir``: the MindIR as given; ``model.entry`` + ``model.checkpoint``: the MindIR the graph
  stage exports into its folder.  The reference is MindSpore running the MindIR.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ConfigError

EXPORTED_MINDIR = "model.mindir"   # the MindIR the graph stage exports from model.entry + model.checkpoint


def source_field(cfg) -> str:
    return "model.onnx" if cfg.model.onnx else ("model.mindir" if cfg.model.mindir else "model.entry")


def model_file(cfg, graph_dir: Path) -> Path:
    """The file every stage reads the network from."""
    if cfg.model.onnx:
        return cfg.path(cfg.model.onnx)
    return cfg.path(cfg.model.mindir) if cfg.model.mindir else Path(graph_dir) / EXPORTED_MINDIR


def check_given_file(cfg) -> None:
    """A model file named in the configuration exists (the exported MindIR is the graph stage's own)."""
    if cfg.model.onnx or cfg.model.mindir:
        path = model_file(cfg, Path("."))
        if not path.is_file():
            raise ConfigError(f"{source_field(cfg)}: file not found: {path}")


def read_model(cfg, graph_dir: Path):
    """The network as graph IR."""
    check_given_file(cfg)
    path = model_file(cfg, graph_dir)
    if cfg.model.onnx:
        from .onnx_model import read_onnx
        return read_onnx(path, input_shape=cfg.model.input_shape, input_layout=cfg.model.input_layout)
    from .mindir import read_mindir
    return read_mindir(path)


def _batched(run, x: np.ndarray, batch: int) -> np.ndarray:
    """``run`` over ``x`` in chunks of the graph's batch; an output without a leading batch axis (a sequence
    model's (T, batch, classes), read at batch 1) is taken whole per chunk, as the IR's Runner takes it."""
    out = []
    for s in range(0, len(x), batch):
        chunk = x[s:s + batch]
        real = len(chunk)
        if real < batch:
            chunk = np.concatenate([chunk, np.zeros((batch - real,) + chunk.shape[1:], np.float32)])
        y = run(np.ascontiguousarray(chunk, np.float32))
        out.append(y[:real] if y.ndim and y.shape[0] == batch else y)
    return np.concatenate(out)


def mindspore_outputs(mindir: Path, x: np.ndarray, batch: int) -> np.ndarray:
    """MindSpore's own output of a MindIR."""
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    cell = ms.nn.GraphCell(ms.load(str(mindir)))

    def run(chunk):
        y = cell(ms.Tensor(chunk))
        return (y[0] if isinstance(y, (tuple, list)) else y).asnumpy()
    return _batched(run, x, batch)


def onnxruntime_outputs(path: Path, x: np.ndarray, batch: int, input_layout: str = "NCHW") -> np.ndarray:
    """onnxruntime's output of the ONNX file as given (its first output; a converter's leftover with a standard
    meaning in its standard form, ``onnx_model.onnxruntime_model``) on ``x`` (N, C, H, W), which a channels-last
    file (``input_layout`` "NHWC") is fed as N, H, W, C: the comparison is with the file as exported."""
    import onnxruntime as ort

    from .onnx_model import file_input_batch, onnxruntime_model

    sess = ort.InferenceSession(onnxruntime_model(path, (batch,) + tuple(x.shape[1:]), input_layout),
                                providers=["CPUExecutionProvider"])
    feed = sess.get_inputs()[0]
    dtype = np.float16 if feed.type == "tensor(float16)" else np.float32   # a model exported in half precision

    def run(chunk):
        return sess.run(None, {feed.name: file_input_batch(chunk, input_layout).astype(dtype)})[0].astype(np.float32)
    return _batched(run, x, batch)


def reference_outputs(cfg, graph_dir: Path, x: np.ndarray, batch: int) -> np.ndarray:
    """The source runtime's output of the configured network on ``x``."""
    path = model_file(cfg, graph_dir)
    if cfg.model.onnx:
        return onnxruntime_outputs(path, x, batch, cfg.model.input_layout)
    return mindspore_outputs(path, x, batch)
