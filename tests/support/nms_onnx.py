"""A small PaddleDetection-style detector as paddle2onnx writes one with its suppression: inputs ``image``
[N, 3, 32, 32] and ``scale_factor`` [N, 2]; a backbone of two convolutions, a distance head (the distances from each
of the 64 anchor points, stride 4, to the box's sides: ``Relu`` of a 1x1 conv, and a softmax over 8 bins times
[0..7] per side: the distribution integral PicoDet reads with a MatMul by a vector) and a class head (``Sigmoid``
of a 1x1 conv, 3 classes); the boxes decoded as corners and divided by [sx, sy, sx, sy] (``BOXES`` [N, 64, 4]),
the scores [N, 3, 64] (``SCORES``), then ``NonMaxSuppression`` with its thresholds as Constant nodes and a Gather
of the selected scores: the file's outputs are the suppression's."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIZE, STRIDE, CLASSES, BINS, FEATURES = 32, 4, 3, 8, 24
GRID = SIZE // STRIDE
ANCHORS = GRID * GRID
BOXES, SCORES, NMS = "boxes_div", "scores_cat", "nms"
IOU, SCORE = 0.6, 0.05


def nms_detector(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def init(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def constant(name, value, dtype=np.float32):   # paddle2onnx writes constants as Constant nodes
        nodes.append(helper.make_node("Constant", [], [name], name=name,
                                      value=numpy_helper.from_array(np.asarray(value, dtype), name)))
        return name

    def conv(x, name, cin, cout, k, stride, scale=1.0):
        w = rng.normal(size=(cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k)) * scale
        return node("Conv", [x, init(f"{name}.w", w), init(f"{name}.b", rng.normal(0, 0.1, cout))], name,
                    strides=[stride, stride])

    f = node("Relu", [conv("image", "stem", 3, FEATURES, STRIDE, STRIDE)], "stem_relu")
    f = node("Relu", [conv(f, "neck", FEATURES, FEATURES, 1, 1)], "neck_relu")
    # distances: [N, 4 * BINS, 8, 8] -> [N, 64, 4, BINS] -> softmax over bins @ [0..7] -> [N, 64, 4] (in cells)
    d = conv(f, "reg", FEATURES, 4 * BINS, 1, 1)
    d = node("Reshape", [d, init("reg_shape", [-1, 4, BINS, ANCHORS], np.int64)], "reg_r")
    d = node("Transpose", [d], "reg_t", perm=[0, 3, 1, 2])
    d = node("Softmax", [d], "reg_soft", axis=-1)
    d = node("MatMul", [d, init("bins", np.arange(BINS))], "dist")
    lt, rb = (node("Slice", [d, init(f"{n}_s", [a], np.int64), init(f"{n}_e", [a + 2], np.int64),
                             init(f"{n}_ax", [2], np.int64)], n) for n, a in (("lt", 0), ("rb", 2)))
    ys, xs = np.mgrid[0:GRID, 0:GRID]
    centres = init("centres", np.stack([xs.reshape(-1), ys.reshape(-1)], 1) + 0.5)   # [64, 2] in cells
    x1y1 = node("Sub", [centres, lt], "x1y1")
    x2y2 = node("Add", [centres, rb], "x2y2")
    corners = node("Concat", [x1y1, x2y2], "corners", axis=-1)
    pixels = node("Mul", [corners, init("stride", STRIDE)], "pixels")
    sy, sx = (node("Slice", ["scale_factor", init(f"{n}_s", [a], np.int64), init(f"{n}_e", [a + 1], np.int64),
                             init(f"{n}_ax", [1], np.int64)], n) for n, a in (("sy", 0), ("sx", 1)))
    scale = node("Concat", [sx, sy, sx, sy], "scale4", axis=1)
    scale = node("Unsqueeze", [scale, init("axis1", [1], np.int64)], "scale14")
    boxes = node("Div", [pixels, scale], BOXES)
    s = node("Sigmoid", [conv(f, "cls", FEATURES, CLASSES, 1, 1)], "cls_sig")
    scores = node("Reshape", [s, init("cls_shape", [-1, CLASSES, ANCHORS], np.int64)], SCORES)
    nodes.append(helper.make_node(
        "NonMaxSuppression", [boxes, scores, constant("keep", [10], np.int64), constant("iou", [IOU]),
                              constant("score", [SCORE])], ["selected"], name=NMS))
    picked = node("Gather", ["selected", init("col2", [2], np.int64)], "picked", axis=1)
    graph = helper.make_graph(nodes, "ppdet_nms", [
        helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, SIZE, SIZE]),
        helper.make_tensor_value_info("scale_factor", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("selected", TensorProto.INT64, ["K", 3]),
         helper.make_tensor_value_info(picked, TensorProto.INT64, ["K", 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model, full_check=True)
    return model
