"""A small Ultralytics-style detector as an ONNX file, whose INT8 model loses the class scores while its boxes stay
close: the output [1, 4 + classes, anchors] holds cx, cy, w, h in input pixels, then sigmoid class scores.

The score head reads the backbone's features concatenated with one channel near 1000 (a conv with a large bias,
which the score head gives no weight): its AscendQuant range must hold 1000, so its scale step (about 4) rounds
the features (about 0..3) to 0 or one step and the INT8 scores lose what FP32 sees.  The box head reads the
features alone and quantizes well.  A real network gets there with an outlier channel (LLM-style activation
outliers, a badly folded BatchNorm); the effect on the gate is the same as in the YOLOv8n measurements of
/tmp/research/onnx_models.md: the box coordinates dominate the output's energy, so its cosine stays high.

The project's config (``CONFIG``) turns ``quantization.channel_scale`` off, and ends with that ``[quantization]``
table: channel scales move the outlier channel into the score head's weights (the head gives it none) and the INT8
scores are then kept, which is not the case these tests gate.  A test adding quantization keys appends them
without the table header."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIZE, CLASSES, STRIDE = 32, 3, 4
GRID = SIZE // STRIDE
ANCHORS = GRID * GRID
OUTPUT = "output0"


def detector(seed: int = 3) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def init(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def conv(x, name, cin, cout, k, stride, bias=None, scale=1.0):
        w = init(f"{name}.weight", rng.normal(size=(cout, cin, k, k)) * scale * np.sqrt(2.0 / (cin * k * k)))
        b = init(f"{name}.bias", rng.normal(0, 0.1, cout) if bias is None else bias)
        return node("Conv", [x, w, b], name, kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)

    x = node("Relu", [conv("images", "stem", 3, 8, 3, 2)], "stem_relu")
    feat = node("Relu", [conv(x, "down", 8, 16, 3, 2)], "features")                 # [1, 16, 8, 8]
    # boxes: cx, cy at the cell plus a sigmoid offset, w and h 4..20 pixels
    gy, gx = np.meshgrid(np.arange(GRID), np.arange(GRID), indexing="ij")
    offset = np.stack([gx * STRIDE, gy * STRIDE, np.full_like(gx, 4), np.full_like(gx, 4)])[None].astype(np.float32)
    box = node("Sigmoid", [conv(feat, "box", 16, 4, 1, 1)], "box_sigmoid")
    box = node("Mul", [box, init("box_scale", np.array([STRIDE, STRIDE, 16, 16]).reshape(1, 4, 1, 1))], "box_scaled")
    box = node("Add", [box, init("box_offset", offset)], "boxes")
    # scores: the features and a channel near 1000 the head gives no weight
    big = conv(feat, "outlier", 16, 1, 1, 1, bias=[1000.0], scale=0.01)
    both = node("Concat", [feat, big], "score_input", axis=1)
    w = rng.normal(size=(CLASSES, 17, 1, 1)) * 1.2
    w[:, 16] = 0.0
    logits = node("Conv", [both, init("score.weight", w), init("score.bias", [-2.5] * CLASSES)], "score",
                  kernel_shape=[1, 1])
    scores = node("Sigmoid", [logits], "scores")
    out = node("Concat", [box, scores], "head", axis=1)
    inits.append(numpy_helper.from_array(np.array([1, 4 + CLASSES, ANCHORS], np.int64), "head_shape"))
    out = node("Reshape", [out, "head_shape"], OUTPUT)
    graph = helper.make_graph(nodes, "yolo_style", [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                                                  [1, 3, SIZE, SIZE])],
                              [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, [1, 4 + CLASSES, ANCHORS])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


CONFIG = """
[model]
onnx = "model.onnx"
input_shape = [1, 3, 32, 32]
input_name = "images"

[normalization]
mean = [0.0, 0.0, 0.0]
std = [1.0, 1.0, 1.0]
scale = "0-1"
channel_order = "RGB"

[calibration]
data_dir = "calib"
count = 40
method = "minmax"

[evaluation]
data_dir = "heldout"
{evaluation}

[aipp]
template = "static_rgb888_u8.cfg"
input_channel_order = "BGR"

[quantization]
channel_scale = false
"""


def project(folder: Path, repo: Path, evaluation: str, held_out: int = 40) -> Path:
    """A model repo: model.onnx, calibration and held-out images (the demo's digits, flat), quantflow.toml with
    the ``[evaluation]`` lines given."""
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(detector(), folder / "model.onnx")
    shutil.copytree(repo / "calib_data", folder / "calib")
    (folder / "heldout").mkdir()
    for i, src in enumerate(sorted((repo / "eval_data").glob("*/*.png"))[::7][:held_out]):
        shutil.copy2(src, folder / "heldout" / f"frame_{i:03d}.png")
    (folder / "quantflow.toml").write_text(CONFIG.format(evaluation=evaluation))
    return folder
