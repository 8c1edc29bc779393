"""A small Ultralytics-style detector as an ONNX file whose last layer is an identity 1x1 convolution appended on
its head (issue 36's NudeNet case in small): the output [1, 4 + classes, anchors] holds boxes in "pixels" (up to a
few hundred) and sigmoid scores in 0..1, and that conv's one INT8 input step (the boxes' range / 127) rounds every
score to 0: alone in INT8 it loses the scores (SQNR about 0 dB) while the whole output, whose energy is the boxes',
stays near 50 dB.  The box head reads the features beside a channel near ``outlier`` it gives no weight, so alone in
INT8 its coarse input step costs the boxes a little (the whole output about 44 dB at 30): ranked by the whole
output it comes first, though the detections hardly change.

``CONFIG``: the project (``quantization.channel_scale = false``: channel scales would move the boxes' range into
the appended conv's weights and keep the scores; ``recover = "off"``), the detection metric with the parts
``quantflow init`` proposes reported beside it."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIZE, CLASSES, STRIDE, FEATURES = 32, 14, 4, 24   # > 16 input channels: INT8 on the device
GRID = SIZE // STRIDE
ANCHORS = GRID * GRID
IDENTITY, BOX = "identity", "box"     # the appended conv, the box head's conv (node names = layer scopes)


def head_detector(seed: int = 5, outlier: float = 30.0, scale: float = 20.0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def init(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def conv(x, name, cin, cout, k, stride, w=None, b=None):
        w = rng.normal(size=(cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k)) if w is None else w
        b = rng.normal(0, 0.1, cout) if b is None else b
        return node("Conv", [x, init(f"{name}.weight", w), init(f"{name}.bias", b)], name, kernel_shape=[k, k],
                    strides=[stride, stride], pads=[k // 2] * 4)

    x = node("Relu", [conv("images", "stem", 3, 8, 3, 2)], "stem_relu")
    feat = node("Relu", [conv(x, "down", 8, FEATURES, 3, 2)], "features")              # [1, 24, 8, 8]
    big = conv(feat, "outlier", FEATURES, 1, 1, 1, w=rng.normal(size=(1, FEATURES, 1, 1)) * 0.01, b=[outlier])
    wide = node("Concat", [feat, big], "box_input", axis=1)
    wb = rng.normal(size=(4, FEATURES + 1, 1, 1)) * np.sqrt(2.0 / FEATURES)
    wb[:, FEATURES] = 0.0
    gy, gx = np.meshgrid(np.arange(GRID), np.arange(GRID), indexing="ij")
    offset = np.stack([gx * STRIDE, gy * STRIDE, np.full_like(gx, 4), np.full_like(gx, 4)])[None].astype(np.float32)
    box = node("Sigmoid", [conv(wide, BOX, FEATURES + 1, 4, 1, 1, w=wb)], "box_sigmoid")
    box = node("Mul", [box, init("box_scale", scale * np.array([STRIDE, STRIDE, 16, 16]).reshape(1, 4, 1, 1))],
               "box_scaled")
    box = node("Add", [box, init("box_offset", scale * offset)], "boxes")
    scores = node("Sigmoid", [conv(feat, "score", FEATURES, CLASSES, 1, 1, b=[-2.0] * CLASSES)], "scores")
    both = node("Concat", [box, scores], "head", axis=1)
    eye = np.eye(4 + CLASSES)[:, :, None, None]
    ident = conv(both, IDENTITY, 4 + CLASSES, 4 + CLASSES, 1, 1, w=eye, b=np.zeros(4 + CLASSES))
    inits.append(numpy_helper.from_array(np.array([1, 4 + CLASSES, ANCHORS], np.int64), "head_shape"))
    out = node("Reshape", [ident, "head_shape"], "output0")
    graph = helper.make_graph(nodes, "appended_identity", [helper.make_tensor_value_info(
        "images", TensorProto.FLOAT, [1, 3, SIZE, SIZE])], [helper.make_tensor_value_info(
            out, TensorProto.FLOAT, [1, 4 + CLASSES, ANCHORS])], inits)
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
metric = "detection"
parts.boxes = { axis = 1, slice = "0:4", gate = false }
parts.scores = { axis = 1, slice = "4:", gate = false }

[aipp]
template = "static_rgb888_u8.cfg"
input_channel_order = "BGR"

[quantization]
channel_scale = false
recover = "off"
"""


def project(folder: Path, repo: Path, held_out: int = 60) -> Path:
    """A model repo: model.onnx, calibration and held-out images (the demo's digits, flat), quantflow.toml."""
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(head_detector(), folder / "model.onnx")
    shutil.copytree(repo / "calib_data", folder / "calib")
    (folder / "heldout").mkdir()
    for i, src in enumerate(sorted((repo / "eval_data").glob("*/*.png"))[::5][:held_out]):
        shutil.copy2(src, folder / "heldout" / f"frame_{i:03d}.png")
    (folder / "quantflow.toml").write_text(CONFIG)
    return folder
