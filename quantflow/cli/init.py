"""``quantflow init``: a commented quantflow.toml for the user's model.

What can be read off the files is filled in (input name and shape, class count from the model's output or
from the calibration folder's per-class sub-folders; a model whose outputs are not one (batch, classes)
tensor, e.g. a detector's heads, gets the outputs gate on unlabelled image folders); what only the user
knows (the training normalization, the gate's limit) carries a default marked EDIT.  The written file always loads with
``load_config``; an existing file is never overwritten.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..config import DEFAULT_CONFIG_NAME, load_config
from ..errors import ConfigError, DataError

TEMPLATE = """# quantflow configuration (written by `quantflow init`). Paths are relative to this file.
# Every key: README.md, "Configuration". Lines marked EDIT hold defaults only you can check.

[model]
{source}
input_shape = {input_shape}   # N, C, H, W the network takes{shape_note}
input_name = "{input_name}"    # the graph input's name (atc --input_shape)
{classes_line}
# verify_images = 8          # calibration images on which the graph IR is checked against the source runtime
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
# batch_size = 32
# on_bad_image = "error"     # or "skip": unreadable / wrong-size images are listed and left out

[evaluation]
{evaluation_lines}
# batch_size = 64

[quantization]
# skip = []                  # ops left in float16 (node names, layer scopes with globs, or op types)
# fallback = "off"           # "auto": roll the most sensitive ops back to float16 until the gate passes
# sensitivity_images = 32

[aipp]
template = "{template}"   # shipped with quantflow: static_rgb888_u8.cfg, static_yuv400_u8.cfg
input_channel_order = "{frame_order}"   # EDIT: channel order of the frames the device is fed

[build]
output_dir = "build"
soc_version = "Ascend310P3"
precision_mode = "allow_fp32_to_fp16"
# atc_args = []              # extra atc options, e.g. ["--buffer_optimize=l2_optimize"]

[engine]
workers = 1                  # local worker processes for the gate and the per-layer analysis
# ray_address = "auto"       # or "ray://head:10001": shard over a Ray cluster (pip install 'quantflow[ray]')
"""


EVALUATION_TOP1 = """data_dir = "{eval}"       # held-out per-class images for the accuracy gate
threshold = 0.01             # EDIT: largest allowed top-1 drop of INT8 against FP32 (0.01 = 1 point)"""

EVALUATION_OUTPUTS = """metric = "outputs"           # INT8 against FP32 on every output (the model is not one classification output)
data_dir = "{eval}"       # held-out images, directly in it or in sub-folders (no labels)
min_cosine = 0.99            # EDIT: least cosine similarity of INT8 to FP32 allowed on any output"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--onnx", type=Path, help="the trained network as ONNX")
    src.add_argument("--mindir", type=Path, help="the trained network as MindIR")
    src.add_argument("--entry", help="'package.module:callable' building the MindSpore network (with --checkpoint)")
    p.add_argument("--checkpoint", type=Path, help="the MindSpore checkpoint, with --entry")
    p.add_argument("--calib", type=Path, default=Path("calib_data"), help="calibration images (per-class folders)")
    p.add_argument("--eval", type=Path, default=Path("eval_data"), help="held-out images (per-class folders)")
    p.add_argument("-o", "--output", type=Path, default=Path(DEFAULT_CONFIG_NAME))


def _model_io(a) -> tuple[list[int] | None, str | None, list[list] | None]:
    """Input shape, input name and output shapes read off the model file (None where unknown)."""
    if a.onnx is not None:
        import onnx
        if not a.onnx.is_file():
            raise ConfigError(f"--onnx: file not found: {a.onnx}")
        g = onnx.load(str(a.onnx), load_external_data=False).graph
        init = {i.name for i in g.initializer}
        inp = next(i for i in g.input if i.name not in init)
        dims = [d.dim_value or None for d in inp.type.tensor_type.shape.dim]
        outs = [[d.dim_value or None for d in o.type.tensor_type.shape.dim] for o in g.output]
        return ([1] + dims[1:] if len(dims) == 4 else None), inp.name, outs
    if a.mindir is not None:
        from ..frontends.mindir import read_mindir
        if not a.mindir.is_file():
            raise ConfigError(f"--mindir: file not found: {a.mindir}")
        g = read_mindir(a.mindir)
        shape = list(g.tensors[g.inputs[0]].shape)
        return shape if len(shape) == 4 else None, None, [list(g.shape(o)) for o in g.outputs]
    return None, None, None


def _image_count(folder: Path, labelled: bool) -> int | None:
    """How many images the calibration folder holds (per-class folders, or an unlabelled folder), if readable."""
    from ..data.images import scan_class_folders, scan_image_groups

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


def write_config(a) -> Path:
    out: Path = a.output
    if out.exists():
        raise ConfigError(f"{out} exists; quantflow init does not overwrite it (give -o another name)")
    if a.entry is not None and a.checkpoint is None:
        raise ConfigError("--entry needs --checkpoint (the trained weights)")
    base = out.resolve().parent
    shape, name, outs = _model_io(a)
    classifier = not outs or (len(outs) == 1 and len(outs[0]) == 2)
    if a.onnx is not None:
        source = f'onnx = "{_rel(a.onnx, base)}"'
    elif a.mindir is not None:
        source = f'mindir = "{_rel(a.mindir, base)}"'
    else:
        source = f'entry = "{a.entry}"\ncheckpoint = "{_rel(a.checkpoint, base)}"'
    classes = ((outs[0][-1] if outs else None) or _class_count(a.calib)) if classifier else None
    found = _image_count(a.calib, classifier)
    count = min(max(200, classes or 0), found or 10 ** 9)
    evaluation = EVALUATION_TOP1 if classifier else EVALUATION_OUTPUTS
    text = TEMPLATE.format(
        source=source, input_shape=[d or 224 for d in shape] if shape else [1, 3, 224, 224],
        shape_note="" if shape and all(shape) else "   EDIT: not fixed in the model file",
        input_name=name or "x",
        classes_line=(f"num_classes = {classes or 1000}" + ("" if classes else "   # EDIT: the model's output width"))
        if classifier else f"# num_classes: not needed, the outputs {outs} are gated by evaluation.metric = \"outputs\"",
        calib_note="per-class sub-folders of real images (e.g. {}/cat/*.jpg)".format(_rel(a.calib, base)) if classifier
        else "real images, directly in it or in sub-folders (sampled as groups, e.g. one per camera)",
        evaluation_lines=evaluation.format(eval=_rel(a.eval, base)),
        calib=_rel(a.calib, base), count=count, count_note=f"; all {found} found there" if count == found else "",
        template="static_yuv400_u8.cfg" if shape and shape[1] == 1 else "static_rgb888_u8.cfg",
        frame_order="GRAY" if shape and shape[1] == 1 else "BGR")
    if shape and shape[1] == 1:
        text = (text.replace("mean = [0.485, 0.456, 0.406]", "mean = [0.5]").replace("std = [0.229, 0.224, 0.225]",
                "std = [0.5]").replace('channel_order = "RGB" ', 'channel_order = "GRAY"'))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text(text)
    try:
        load_config(tmp)
    except ConfigError as err:
        tmp.unlink()
        raise ConfigError(f"quantflow init could not write a valid config for these files: {err}") from None
    tmp.replace(out)
    return out
