"""The configured network, whatever its format: the file that holds it, how it is read into the graph
IR, and the runtime whose output the IR is checked against.

- ``model.onnx``: the ONNX file as given, read by ``onnx_model.read_onnx`` with its input fixed to
  ``model.input_shape`` (N, C, H, W; a channels-last file, ``model.input_layout = "NHWC"``, is read with an
  N, C, H, W input) and, with ``model.outputs``, ending at those tensors (``onnx_cut.cut``); the reference is
  onnxruntime running that file unchanged (cut the same way), fed in its own layout.
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
        return read_onnx(path, input_shape=cfg.model.input_shape, input_layout=cfg.model.input_layout,
                         extra_inputs=extra_input_values(cfg), outputs=cfg.model.outputs)
    from .mindir import read_mindir
    return read_mindir(path)


def extra_input_values(cfg) -> dict:
    """``model.inputs`` as input name -> the configured value (``quantflow.data.extra_inputs``)."""
    return {k: v.value for k, v in cfg.model.inputs.items()}


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


_FLOATS = {"tensor(float16)": np.float16, "tensor(double)": np.float64}   # onnxruntime's input types


def onnxruntime_outputs(path: Path, x: np.ndarray, batch: int, input_layout: str = "NCHW",
                        fixed_inputs: dict | None = None, outputs=()) -> np.ndarray:
    """onnxruntime's output of the ONNX file as given (its first output; a converter's leftover with a standard
    meaning in its standard form, ``onnx_model.onnxruntime_model``) on ``x`` (N, C, H, W), which a channels-last
    file (``input_layout`` "NHWC") is fed as N, H, W, C: the comparison is with the file as exported.
    ``fixed_inputs``: the other inputs' values per image (``Graph.fixed_inputs``), fed beside every image;
    ``outputs``: the tensors the file is cut at (``model.outputs``)."""
    import onnxruntime as ort

    from ..data.extra_inputs import batch_of
    from .onnx_model import file_input_batch, onnxruntime_model

    fixed = fixed_inputs or {}
    sess = ort.InferenceSession(onnxruntime_model(path, (batch,) + tuple(x.shape[1:]), input_layout, fixed, outputs),
                                providers=["CPUExecutionProvider"])
    feed = next(i for i in sess.get_inputs() if i.name not in fixed)
    dtype = _FLOATS.get(feed.type, np.float32)   # a model exported in half precision
    others = {i.name: batch_of(fixed[i.name], batch).astype(_FLOATS.get(i.type, np.float32))
              for i in sess.get_inputs() if i.name in fixed}

    def run(chunk):
        feeds = {feed.name: file_input_batch(chunk, input_layout).astype(dtype), **others}
        return sess.run(None, feeds)[0].astype(np.float32)
    return _batched(run, x, batch)


def reference_outputs(cfg, graph_dir: Path, x: np.ndarray, batch: int, fixed_inputs: dict | None = None) -> np.ndarray:
    """The source runtime's output of the configured network on ``x`` (``fixed_inputs``: the other inputs' values
    per image, ``Graph.fixed_inputs``)."""
    path = model_file(cfg, graph_dir)
    if cfg.model.onnx:
        return onnxruntime_outputs(path, x, batch, cfg.model.input_layout, fixed_inputs, cfg.model.outputs)
    return mindspore_outputs(path, x, batch)
