"""The commented quantflow.toml ``quantflow init`` (quantflow.cli.init) and ``quantflow.quantize`` (quantflow.api)
write for the user's model.

What can be read off the files is filled in: the input name; the input shape, from the model file where it is
fixed there, its dynamic height and width (and batch 1) from the calibration images (or ``--input-shape``), always
N, C, H, W (a channels-last ONNX input gets ``model.input_layout = "NHWC"``, ``frontends.onnx_model``); then
the network runs at that shape on a few calibration images (onnxruntime on an ONNX file, the graph IR of a
MindIR, the ``--entry`` network in MindSpore) and the gate is chosen from what it really returns
(``evaluation.heads.recognise``, shapes and values): one (batch, classes) output gets the top-1 gate with that
class count on per-class folders; a YOLO head, a CTC sequence, a text map or a segmentation map its task metric
(with the metric's default limits written out, its YOLO parts reported, not gated) on unlabelled folders;
anything else the outputs gate.  A comment says what was recognised and from what.  What only the user knows
(the training normalization, the gate's limits) carries a default marked EDIT.  The written file always loads
with ``load_config``; an existing file is never overwritten.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from types import SimpleNamespace

from .config import load_config
from .errors import ConfigError, DataError
from .data.extra_inputs import guess
from .evaluation.parts import parts_toml
from .frontends.onnx_model import file_input_shape

TEMPLATE = """# quantflow configuration (written by `quantflow init`). Paths are relative to this file.
# Every key: docs/configuration.md. Lines marked EDIT hold defaults only you can check.

[model]
{source}
input_shape = {input_shape}   # N, C, H, W the network takes{shape_note}
{layout_line}input_name = "{input_name}"    # the graph input's name (atc --input_shape)
{classes_line}
# verify_images = 2          # calibration images on which the graph IR is checked against the source runtime
# verify_tolerance = 1e-3    # largest allowed |IR - source| relative to the largest |output|

[normalization]
# EDIT: exactly what your training preprocessing did: (pixel [/255] - mean) / std, in this channel order
mean = [0.485, 0.456, 0.406]
std = [0.229, 0.224, 0.225]
scale = "0-1"                # "0-1": mean/std apply to pixels/255; "0-255": to raw pixels
channel_order = "RGB"        # channel order the network was trained on: RGB, BGR or GRAY
# reference = "mypkg.data:preprocess"   # optional: your own preprocessing function, checked against AIPP

[calibration]
data_dir = "{calib}"      # {calib_note}
count = {count}                  # images sampled (seeded, stratified){count_note}
per_class_min = 1            # at least this many of every class (or sub-folder group)
seed = 0
method = "mse"               # range method: mse, minmax, percentile or kl
# batch_size = 8
# on_bad_image = "error"     # or "skip": unreadable / wrong-size images are listed and left out

[evaluation]
{evaluation_lines}
# batch_size = 64

[quantization]
# skip = []                  # ops left in float16 (node names, layer scopes with globs, or op types)
# fallback = "off"           # "auto": roll the most sensitive ops back to float16 until the gate passes
# sensitivity = "auto"       # per-layer analysis: for fallback "auto" or a failing gate; "always": every build
# sensitivity_images = 32

[aipp]
template = "{template}"   # shipped with quantflow: static_rgb888_u8.cfg, static_yuv400_u8.cfg
input_channel_order = "{frame_order}"   # EDIT: channel order of the frames the device is fed

[build]
output_dir = "build"
soc_version = "Ascend310P3"
precision_mode = "force_fp16"    # what the INT8 emulation models (atc's default)
# atc_args = []              # extra atc options, e.g. ["--buffer_optimize=l2_optimize"]
{batch_line}
[engine]
workers = 1                  # local worker processes for the gate and the per-layer analysis
# ray_address = "auto"       # or "ray://head:10001": shard over a Ray cluster (needs Ray: the ray extra of quantflow-ascend)
"""


# where the model file ends in a suppression (quantflow.frontends.onnx_cut): the cut init makes
SUPPRESSION_LINES = """# the file ends in NonMaxSuppression (node {node}): the device computes up to its inputs, the decoded
# boxes and the class scores; the application suppresses overlaps on the host (docs/onnx-models.md, Suppression)
outputs = {outputs}"""

# where the model file leaves its batch free (a recogniser fed each frame's crops): the option, commented out
BATCH_LINE = """# batch_sizes = [1, 8, 16]  # the model file's batch is free: the batch sizes the device serves (one INT8 .om each)
"""


LAYOUT_LINE = """input_layout = "{layout}"        # the file's input is {file_shape}, N, H, W, C: built as N, C, H, W
"""

EVALUATION_TOP1 = """data_dir = "{eval}"       # held-out per-class images for the accuracy gate
threshold = 0.01             # EDIT: largest allowed top-1 drop of INT8 against FP32 (0.01 = 1 point)"""

EVALUATION_OUTPUTS = """metric = "outputs"           # INT8 against FP32 on every output (the model is not one classification output)
data_dir = "{eval}"       # held-out images, directly in it or in sub-folders (no labels)
min_cosine = 0.99            # EDIT: least cosine similarity of INT8 to FP32 allowed on any output"""


EVALUATION_TASK = """metric = "{metric}"{pad}# the task metric of the head recognised above
data_dir = "{{eval}}"       # held-out images, directly in it or in sub-folders (INT8 is compared with FP32: no labels)
{limits}{options}"""


def _head(runs: list[list], names: list[str] | None, shape: list[int], images: int):
    """``heads.recognise`` on every run (each a batch of calibration images): the head all of them show, or the
    outputs gate when they disagree (a value test that holds on some images only)."""
    from .evaluation.heads import Head, recognise

    names = names or [f"output{k}" for k in range(len(runs[0]))]
    found = [recognise(dict(zip(names, outs)), shape) for outs in runs]
    if any(f.metric != found[0].metric or f.options != found[0].options for f in found):
        seen = "; ".join(dict.fromkeys(f.what for f in found))
        return Head("outputs", f"no one head on every calibration image ({seen})")
    on = f"on {images} calibration image{'s' if images != 1 else ''}" if images else "on an all-zero input"
    return Head(found[0].metric, f"{found[0].what} ({on})", found[0].options, found[0].parts)


def _toml_table(d: dict) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in d.items()) + " }"


def _evaluation_lines(head, classifier: bool) -> str:
    """The [evaluation] lines of the recognised head (None: not run; ``classifier``: the top-1 gate on per-class
    folders): the comment saying what was recognised and from what, the metric with its default limits written
    out (those on numbers it returns without labels), its options."""
    import textwrap

    said = "" if head is None else "\n".join(
        "# " + line for line in textwrap.wrap(f"quantflow init recognised {head.what}.", 114)) + "\n"
    if classifier:
        return said + EVALUATION_TOP1
    if head is not None and head.metric == "top1":   # a classifier, but no per-class folders to read labels from
        said += "# the calibration folder holds no per-class folders, so no top-1 gate: the outputs gate\n"
    if head is None or head.metric in ("top1", "outputs"):
        return said + EVALUATION_OUTPUTS
    from .evaluation.task import TaskMetric

    metric = TaskMetric(head.metric, head.options)
    try:
        returned = set(metric.summarize([]))    # the numbers it returns with no image: those not needing labels
    except Exception:  # a metric that cannot summarize nothing: no limit written, its defaults apply unseen
        returned = set()
    limits = ""
    for kind in ("min", "max"):
        shown = {k: v for k, v in metric.defaults[kind].items() if k in returned}
        if shown:
            limits += (f"{kind} = {_toml_table(shown)}".ljust(40)
                       + f"# EDIT: {'least' if kind == 'min' else 'largest'} values allowed (the metric's defaults)\n")
    options = f"options = {_toml_table(head.options)}\n" if head.options else ""
    line = f'metric = "{head.metric}"'
    return said + EVALUATION_TASK.format(metric=head.metric, pad=" " * max(1, 29 - len(line)), limits=limits,
                                         options=options).rstrip("\n")


def _inputs_toml(guesses: dict) -> str:
    """The [model.inputs] table: each input other than the image with the value init guessed for it (name ->
    (value, whether the name made it a sure guess)), every line marked EDIT."""
    lines = ["[model.inputs]   # the inputs other than the image: the value every image is fed with "
             "(docs/configuration.md); deploy.onnx keeps them as inputs"]
    for k, (value, sure) in guesses.items():
        why = "guessed from the name" if sure else "zeros: quantflow cannot tell"
        key = k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)   # a TOML bare key, else quoted
        lines.append(f"{key} = {{ value = {value} }}   # EDIT: what your application feeds ({why})")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- what the files say

def _declared_input(a) -> tuple[list | None, str | None, dict]:
    """The model file's image input dims (None where dynamic) and name, and its other inputs' dims by name (an ONNX
    file's: the image input is its one 4-D input); (None, None, {}) for an --entry network.  An ONNX file ending in
    a suppression is read cut before it: ``a.suppression`` (``onnx_cut.suppression_tail``) and ``a.outputs`` (the
    cut, which init writes as model.outputs) are set."""
    if a.onnx is not None:
        import onnx
        if not a.onnx.is_file():
            raise ConfigError(f"--onnx: file not found: {a.onnx}")
        from .frontends.onnx_model import refuse_quantized
        try:
            model = onnx.load(str(a.onnx), load_external_data=False)
        except Exception as err:  # protobuf's DecodeError
            raise ConfigError(f"--onnx: {a.onnx} is not a readable ONNX file: {err}") from None
        refuse_quantized(model, str(a.onnx))   # an already quantized model: say so now, not at the build
        from .frontends.onnx_cut import cut, suppression_tail
        a.suppression = suppression_tail(model)
        if a.suppression is not None:   # the device computes up to the suppression's inputs (model.outputs)
            a.outputs = [a.suppression.boxes, a.suppression.scores]
            model = cut(model, a.outputs, str(a.onnx))
        g = model.graph
        init = {i.name for i in g.initializer}
        inputs = [i for i in g.input if i.name not in init]
        dims = {i.name: [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                         for d in i.type.tensor_type.shape.dim] for i in inputs}
        images = [k for k, d in dims.items() if len(d) == 4] if len(dims) > 1 else list(dims)
        if len(images) != 1:
            raise ConfigError(
                f"--onnx: {a.onnx} has {len(dims)} inputs ({', '.join(dims)}), {len(images)} of them 4-D: quantflow "
                f"feeds the images to the one 4-D (N, C, H, W) input and a configured value to each other "
                f"([model.inputs]); it cannot tell which input takes the images")
        return dims[images[0]], images[0], {k: d for k, d in dims.items() if k != images[0]}
    if a.mindir is not None:
        if not a.mindir.is_file():
            raise ConfigError(f"--mindir: file not found: {a.mindir}")
        g = _mindir_graph(a.mindir)
        return list(g.tensors[g.inputs[0]].shape), None, {}
    return None, None, {}


@functools.lru_cache(maxsize=1)
def _mindir_graph(path: Path):
    from .frontends.mindir import read_mindir
    return read_mindir(path)


def _image_shape(folder: Path) -> tuple[int, int, int] | None:
    """(channels, height, width) of the first readable image in the folder (or its sub-folders)."""
    import cv2

    from .data.images import scan_image_groups
    try:
        items = scan_image_groups(folder)
    except DataError:
        return None
    for it in items[:20]:
        img = cv2.imread(str(it.path), cv2.IMREAD_UNCHANGED)
        if img is not None:
            return (1 if img.ndim == 2 or img.shape[2] == 1 else 3), img.shape[0], img.shape[1]
    return None


def _channels_last(declared: list | None) -> bool:
    """Whether the model file's 4-D input reads as N, H, W, C: 1 or 3 channels last and not second (a dynamic
    second dimension included: tf2onnx writes [unk, unk, unk, 3] for a model of any image size)."""
    return declared is not None and len(declared) == 4 and declared[3] in (1, 3) and declared[1] not in (1, 3)


def _input_shape(a, declared: list | None, images) -> tuple[list[int], str, str]:
    """The input shape to build for (N, C, H, W, whatever the file's layout), a note on where it came from, and
    the file's input layout (``model.input_layout``)."""
    layout = "NCHW"
    if _channels_last(declared):   # read as N, C, H, W: what the images, AIPP and the IR take (onnx_model)
        layout, declared = "NHWC", [declared[0], declared[3], declared[1], declared[2]]
    shape, note = _nchw_shape(a, declared, images, " (its N, H, W, C input as N, C, H, W)" if layout == "NHWC" else "")
    return shape, note, layout


def _nchw_shape(a, declared: list | None, images, read_as: str = "") -> tuple[list[int], str]:
    """The input shape to build for, and a note on where it came from (``declared``: N, C, H, W; ``read_as`` says
    how it was read off the file, for the messages)."""
    if a.input_shape is not None:
        if declared is not None:
            clash = [f"dimension {i} is {d}" for i, (d, g) in enumerate(zip(declared, a.input_shape))
                     if d is not None and d != g]
            if len(declared) != 4 or clash:
                raise ConfigError(f"--input-shape {a.input_shape}: the model's input is {declared}{read_as} "
                                  f"({', '.join(clash) or 'not 4-D'})")
        return list(a.input_shape), " (from --input-shape)"
    if declared is not None and len(declared) != 4:
        raise ConfigError(f"the model's input has shape {declared}; quantflow builds image networks (N, C, H, W)")
    dims = list(declared) if declared is not None else [None, None, None, None]
    dims[0] = dims[0] or 1
    if dims[1] is None:
        dims[1] = images[0] if images else 3
    note = ""
    if dims[2] is None or dims[3] is None:
        if images:
            dims[2], dims[3] = dims[2] or images[1], dims[3] or images[2]
            note = ("; height and width from the calibration images" if declared is None else
                    "; the model's dynamic height / width set from the calibration images")
        else:
            dims[2], dims[3] = dims[2] or 224, dims[3] or 224
            note = "   EDIT: not fixed in the model file, and no calibration images to read it from"
    return dims, note


CALIBRATION_COUNT = 200   # images init samples for the ranges where the folder holds enough
TUNING_SHARE = 0.5        # of a folder too small for that and as many tuning images: left out of the sample


def calibration_count(found: int | None, classes: int | None) -> tuple[int, str]:
    """(``calibration.count`` init writes, its comment): ``CALIBRATION_COUNT`` (at least one per class), but never
    more than 1 - ``TUNING_SHARE`` of the ``found`` images, so that the recovery's check and the automatic fallback
    tune on images the ranges were not fitted on (``evaluation.tune_from = "calibration"``: the images beyond the
    sample).  Tuned on the sample itself, NudeNet's YOLOv8n read cosine 0.9949 where the held-out images read 0.9885,
    and the fallback rolled nothing back."""
    wanted = max(CALIBRATION_COUNT, classes or 0)
    if not found:
        return wanted, ""
    count = max(1, min(wanted, int(found * (1 - TUNING_SHARE)))) if found > 1 else 1
    if count < wanted:
        return count, (f"; {count} of the {found} found there: the other {found - count} tune the recovery and "
                       f"the fallback, on images the ranges were not fitted on")
    return count, ""


RUN_IMAGES = 4   # calibration images the network is run on to recognise its head (shapes and values)


def _probe_inputs(a, shape: list[int]) -> tuple[list, int]:
    """Up to ``RUN_IMAGES`` batches of calibration images at ``shape`` (the template's default normalization:
    what the head's values are read on does not depend on it), and how many images they hold; one batch of
    zeros when none is readable at that size."""
    import numpy as np

    from .data.images import check_image, preprocess, scan_image_groups
    images = []
    try:
        items = scan_image_groups(a.calib)
    except DataError:
        items = []
    for it in items[:8 * RUN_IMAGES]:
        img, _ = check_image(it.path, shape[1], shape[2], shape[3])
        if img is not None:
            images.append(img)
        if len(images) == RUN_IMAGES:
            break
    n = shape[0]
    batches = [np.stack(images[s:s + n]) for s in range(0, len(images) - n + 1, n)]
    if not batches:
        return [np.zeros(shape, np.float32)], 0
    norm = ([0.5], [0.5], "0-1", "GRAY") if shape[1] == 1 else ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225],
                                                                 "0-1", "RGB")
    return [preprocess(b, *norm) for b in batches], n * len(batches)


def _run_outputs(a, shape: list[int], classes: int | None, layout: str = "NCHW",
                 extra: dict | None = None) -> tuple[list[list] | None, int, str]:
    """The outputs of the network (one list of arrays per run) on a few calibration images at ``shape``, how many
    images they were, or (None, 0, the reason) when it cannot run here.  An ONNX file onnxruntime cannot run is a
    ConfigError (``_onnxruntime_runs``): the build could not check its reading against it either."""
    try:
        batches, images = _probe_inputs(a, shape)
    except Exception as err:  # images that cannot be prepared here: init still writes a config
        return None, 0, _first_line(err)
    if a.onnx is not None:
        return _onnxruntime_runs(a.onnx, batches, shape, layout, extra, getattr(a, "outputs", ())), images, ""
    try:
        import numpy as np

        if a.mindir is not None:
            g = _mindir_graph(a.mindir)
            try:
                from .engine.runner import float_runner
                runner = float_runner(g)
                return [[runner.run(x)[o] for o in g.outputs] for x in batches], images, ""
            except Exception:  # the IR cannot run it here: its shapes only (zeros: no value test will hold)
                return [[np.zeros(g.shape(o), np.float32) for o in g.outputs]], 0, ""
        return [_entry_outputs(a, x, classes) for x in batches], images, ""
    except Exception as err:  # whatever the runtime or the user's network raises: init still writes a config
        return None, 0, _first_line(err)


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _onnxruntime_runs(path: Path, batches: list, shape: list[int], layout: str = "NCHW",
                     extra: dict | None = None, outputs=()) -> list[list]:
    """onnxruntime's outputs of the ONNX file on each batch (N, C, H, W; fed in the file's ``layout``): what the
    build checks the graph IR against; ``extra``: the other inputs' values ([model.inputs] as init writes it);
    ``outputs``: the tensors the file is cut at (``model.outputs`` as init writes it).  A
    ConfigError where onnxruntime cannot load or run the file, with onnxruntime's error, the nodes outside
    standard ONNX (domain and op) and the fix."""
    import numpy as np
    import onnxruntime as ort

    from .errors import QuantflowError
    from .frontends.onnx_model import file_input_batch, file_input_shape, onnxruntime_model
    try:
        extra = extra or {}
        model = onnxruntime_model(path, shape, layout, extra, outputs)   # leftovers in standard form, the cut
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        types = {"tensor(float16)": np.float16, "tensor(double)": np.float64, "tensor(uint8)": np.uint8}
        inp = next(i for i in sess.get_inputs() if i.name not in extra)
        dtype = types.get(inp.type, np.float32)
        others = {i: next(j for j in sess.get_inputs() if j.name == i) for i in extra}
        return [sess.run(None, {inp.name: file_input_batch(x, layout).astype(dtype),
                                **{k: np.broadcast_to(np.asarray(v, types.get(others[k].type, np.float32)),
                                                      (len(x),) + np.shape(v)) for k, v in extra.items()}})
                for x in batches]
    except QuantflowError as err:
        raise ConfigError(f"--onnx: {err}") from None
    except Exception as err:  # onnxruntime's own errors (an op it lacks, an invalid model, a shape it refuses)
        raise ConfigError(_cannot_run_message(path, err, file_input_shape(shape, layout))) from None


def _cannot_run_message(path: Path, err: Exception, shape: list[int]) -> str:
    """Why init stops on an ONNX file onnxruntime cannot run: its error, the nodes outside standard ONNX, the fix."""
    import onnx

    from .frontends.onnx_custom import describe_nodes, nonstandard_nodes, unknown_op_fix
    said = " ".join(str(err).split()) or type(err).__name__
    model = onnx.load(str(path), load_external_data=False)
    found = nonstandard_nodes(model)
    text = f"--onnx: onnxruntime cannot run {path} at input shape {shape}: {said}"
    if not found:
        return (text + ". The build checks quantflow's reading of the model against onnxruntime on this file: fix "
                       "the model so that onnxruntime runs it (onnx.checker.check_model(path, full_check=True) names "
                       "what is invalid in it), or give --input-shape where the shape is wrong")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    fixes = dict.fromkeys(unknown_op_fix(d, op, opset) for _, d, op in found)
    return (text + f". It holds ops outside standard ONNX (domain:op): {describe_nodes(found)}. Fix: "
            + "; ".join(fixes) + ". quantflow reads standard ONNX ops only, and the build checks its reading "
            "against onnxruntime on this file")


def _output_names(a) -> list[str] | None:
    """The names the gate gives the outputs of a model file (an ONNX file's declared outputs, a MindIR's by
    position); None for a network built from an entry (its MindIR is exported by the build)."""
    if getattr(a, "outputs", None):
        return list(a.outputs)
    if a.onnx is not None:
        import onnx
        return [o.name for o in onnx.load(str(a.onnx), load_external_data=False).graph.output]
    if a.mindir is not None:
        return list(_mindir_graph(a.mindir).outputs)
    return None


def _entry_outputs(a, x, classes: int | None) -> list:
    import mindspore as ms

    from .frontends.network import build_network

    base = Path.cwd()
    model = SimpleNamespace(entry=a.entry, num_classes=classes or 1000, checkpoint=a.checkpoint)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = build_network(SimpleNamespace(model=model, path=lambda p: base / p))
    y = net(ms.Tensor(x))
    return [o.asnumpy() for o in (y if isinstance(y, (tuple, list)) else [y])]


def _image_count(folder: Path, labelled: bool) -> int | None:
    """How many images the calibration folder holds (per-class folders, or an unlabelled folder), if readable."""
    from .data.images import scan_class_folders, scan_image_groups

    try:
        return len(scan_class_folders(folder) if labelled else scan_image_groups(folder))
    except DataError:
        return None


def _class_count(folder: Path) -> int | None:
    if not folder.is_dir():
        return None
    return sum(1 for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")) or None


def _rel(path: Path, base: Path) -> str:
    path = path.resolve()
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return path.as_posix()


# ----------------------------------------------------------------------------- the config

def write(output: Path, *, calib: Path, eval: Path, onnx: Path | None = None, mindir: Path | None = None,
          entry: str | None = None, checkpoint: Path | None = None,
          input_shape: list[int] | None = None) -> tuple[Path, list[str]]:
    """``write_config`` by keyword: the model (``onnx``, ``mindir``, or ``entry`` with ``checkpoint``) and the image
    folders."""
    return write_config(SimpleNamespace(onnx=onnx, mindir=mindir, entry=entry, checkpoint=checkpoint, calib=calib,
                                        eval=eval, input_shape=input_shape, output=Path(output)))


def write_config(a) -> tuple[Path, list[str]]:
    """The configuration for ``a`` (``quantflow init``'s arguments: onnx / mindir / entry + checkpoint, calib, eval,
    input_shape, output) written to ``a.output``, which must not exist; (that file, the lines saying whether the
    held-out images can decide each gated figure: ``tasks.preflight.gate_power``, also written into the file as
    a comment).  A ConfigError where no valid configuration can be written for these files."""
    out: Path = a.output
    if out.exists():
        raise ConfigError(f"{out} exists; quantflow init does not overwrite it (give -o another name)")
    if a.entry is not None and a.checkpoint is None:
        raise ConfigError("--entry needs --checkpoint (the trained weights)")
    base = out.resolve().parent
    declared, name, others = _declared_input(a)
    shape, shape_note, layout = _input_shape(a, declared, _image_shape(a.calib))
    guesses = {k: guess(k, [shape[0]] + d[1:], (shape[2], shape[3])) for k, d in others.items()}
    folders = _class_count(a.calib)
    runs, images, why = _run_outputs(a, shape, folders, layout, {k: v for k, (v, _) in guesses.items()})
    flat = folders is None and a.calib.is_dir()   # images directly in the folder: no labels for a top-1 gate
    head = None
    if runs is not None:
        outs = [list(o.shape) for o in runs[0]]
        names = _output_names(a)
        head = _head(runs, names if names and len(names) == len(outs) else None, shape, images)
        classifier = head.metric == "top1" and not flat
        classes = outs[0][-1] if classifier else None
        run_note = f"# the network ran at this shape: output{'s' if len(outs) > 1 else ''} {outs}"
    else:  # it cannot run here (an entry's package not importable yet, ...): a classifier of the folders' classes
        classifier, classes, outs = True, folders, None
        run_note = f"# EDIT: the network could not be run here to read its outputs ({why})"
    if a.onnx is not None:
        source = f'onnx = "{_rel(a.onnx, base)}"'
        tail = getattr(a, "suppression", None)
        if tail is not None:
            source += "\n" + SUPPRESSION_LINES.format(outputs=json.dumps(a.outputs), node=tail.node)
            if head is not None and head.metric == "anchor_detection" and tail.iou is not None:
                head.options["nms_iou"] = round(tail.iou, 6)   # the file's own suppression, on both networks
    elif a.mindir is not None:
        source = f'mindir = "{_rel(a.mindir, base)}"'
    else:
        source = f'entry = "{a.entry}"\ncheckpoint = "{_rel(a.checkpoint, base)}"'
    found = _image_count(a.calib, classifier)
    count, count_note = calibration_count(found, classes)
    per_class_min = 1 if not classifier or count >= (classes or 1000) else 0
    evaluation = _evaluation_lines(head, classifier)
    text = TEMPLATE.format(
        source=source + "\n" + run_note, input_shape=shape, shape_note=shape_note, input_name=name or "x",
        layout_line="" if layout == "NCHW" else LAYOUT_LINE.format(layout=layout, file_shape=file_input_shape(shape, layout)),
        classes_line=(f"num_classes = {classes or 1000}" + ("" if classes else "   # EDIT: the model's output width"))
        if classifier else f"# num_classes: not needed, the outputs {outs} are gated by evaluation.metric = "
                           f"\"{head.metric if head and head.metric != 'top1' else 'outputs'}\"",
        calib_note="per-class sub-folders of real images (e.g. {}/cat/*.jpg)".format(_rel(a.calib, base)) if classifier
        else "real images, directly in it or in sub-folders (sampled as groups, e.g. one per camera)",
        evaluation_lines=evaluation.replace("{eval}", _rel(a.eval, base)),
        calib=_rel(a.calib, base), count=count, count_note=count_note,
        template="static_yuv400_u8.cfg" if shape[1] == 1 else "static_rgb888_u8.cfg",
        batch_line=BATCH_LINE if declared and declared[0] is None else "",
        frame_order="GRAY" if shape[1] == 1 else "BGR")
    if guesses:   # after the [model] keys: it opens the [model.inputs] table
        text = text.replace("\n[normalization]\n", f"\n{_inputs_toml(guesses)}\n[normalization]\n", 1)
    parts = parts_toml(head.parts, gate=head.metric == "outputs") if head and head.parts and not classifier else ""
    if parts:   # after the [evaluation] keys: it opens the [evaluation.parts] table
        text = text.replace("# batch_size = 64\n", f"# batch_size = 64\n\n{parts}\n", 1)
    if per_class_min == 0:
        text = text.replace("per_class_min = 1            # at least this many of every class (or sub-folder group)",
                            f"per_class_min = 0            # EDIT: the folder holds {found} images for {classes} classes")
    if shape[1] == 1:
        text = (text.replace("mean = [0.485, 0.456, 0.406]", "mean = [0.5]").replace("std = [0.229, 0.224, 0.225]",
                "std = [0.5]").replace('channel_order = "RGB" ', 'channel_order = "GRAY"'))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text(text)
    try:
        cfg = load_config(tmp)
    except ConfigError as err:
        tmp.unlink()
        lines = [re.sub(r" \(got \{.*\}\)$", "", line) for line in str(err).splitlines()[1:]]   # no whole-config dump
        raise ConfigError("quantflow init could not write a valid config for these files:\n"
                          + "\n".join(lines)) from None
    said = _power_lines(cfg)
    if said:
        tmp.write_text(text.replace("# batch_size = 64\n", "# batch_size = 64\n" + _power_comment(said), 1))
    tmp.replace(out)
    return out, said


def _power_lines(cfg) -> list[str]:
    """Whether the held-out images can decide each gated figure (``tasks.preflight.gate_power``, as the build's
    preflight says it); none where the folder cannot be read yet (the build names the problem)."""
    from .errors import QuantflowError
    from .tasks.preflight import gate_power

    try:
        return gate_power(cfg)["lines"]
    except QuantflowError:
        return []


def _power_comment(lines: list[str]) -> str:
    import textwrap

    out = ["# The gate's power on these held-out images (quantflow init; preflight says it again at each build):"]
    for line in lines:
        out += textwrap.wrap(line, 114, initial_indent="# - ", subsequent_indent="#   ")
    return "\n".join(out) + "\n"
