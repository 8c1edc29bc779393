"""YOLOv5-n and YOLOv8-n as mindyolo builds them, for the model zoo (``benchmarks.zoo yolov5n``).

mindyolo (``pip install mindyolo``, Apache-2.0) ships the layers and the detect heads but not its model
configurations (YAML files in its repository).  These are the "n" scale (depth 0.33, width 0.25) of the
two architectures in mindyolo's config format, on strides 8, 16 and 32:

- ``YOLOV5N``: a C3 backbone with SPPF, an FPN/PAN neck and the anchor-based head (3 anchors per
  level); in inference mode the network returns the decoded predictions (batch, anchors, 5 + classes),
  written into the sigmoid output by slice assignment (TensorScatterUpdate), and the three raw maps
  (batch, 3, H / stride, W / stride, 5 + classes);
- ``YOLOV8N``: a C2f backbone with SPPF, an FPN/PAN neck and the decoupled, anchor-free head with
  distribution focal loss boxes (reg_max 16); it returns the decoded predictions (batch, anchors,
  4 + classes) and the three raw maps (batch, 4 * 16 + classes, H / stride, W / stride).
"""
from __future__ import annotations

_C = "ConvNormAct"
_UP = ["None", 2, "'nearest'"]
YOLOV5N = {
    "model_name": "yolov5", "depth_multiple": 0.33, "width_multiple": 0.25, "stride": [8, 16, 32],
    "anchors": [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]],
    "backbone": [
        [-1, 1, _C, [64, 6, 2, 2]], [-1, 1, _C, [128, 3, 2]], [-1, 3, "C3", [128]],
        [-1, 1, _C, [256, 3, 2]], [-1, 6, "C3", [256]],
        [-1, 1, _C, [512, 3, 2]], [-1, 9, "C3", [512]],
        [-1, 1, _C, [1024, 3, 2]], [-1, 3, "C3", [1024]],
        [-1, 1, "SPPF", [1024, 5]],                                                  # 9
    ],
    "head": [
        [-1, 1, _C, [512, 1, 1]], [-1, 1, "Upsample", _UP], [[-1, 6], 1, "Concat", [1]],
        [-1, 3, "C3", [512, False]],                                                 # 13
        [-1, 1, _C, [256, 1, 1]], [-1, 1, "Upsample", _UP], [[-1, 4], 1, "Concat", [1]],
        [-1, 3, "C3", [256, False]],                                                 # 17: stride 8
        [-1, 1, _C, [256, 3, 2]], [[-1, 14], 1, "Concat", [1]],
        [-1, 3, "C3", [512, False]],                                                 # 20: stride 16
        [-1, 1, _C, [512, 3, 2]], [[-1, 10], 1, "Concat", [1]],
        [-1, 3, "C3", [1024, False]],                                                # 23: stride 32
        [[17, 20, 23], 1, "YOLOv5Head", ["nc", "anchors", "stride"]],
    ],
}
YOLOV8N = {
    "model_name": "yolov8", "depth_multiple": 0.33, "width_multiple": 0.25, "max_channels": 1024,
    "stride": [8, 16, 32], "reg_max": 16,
    "backbone": [
        [-1, 1, _C, [64, 3, 2]], [-1, 1, _C, [128, 3, 2]], [-1, 3, "C2f", [128, True]],
        [-1, 1, _C, [256, 3, 2]], [-1, 6, "C2f", [256, True]],
        [-1, 1, _C, [512, 3, 2]], [-1, 6, "C2f", [512, True]],
        [-1, 1, _C, [1024, 3, 2]], [-1, 3, "C2f", [1024, True]],
        [-1, 1, "SPPF", [1024, 5]],                                                  # 9
    ],
    "head": [
        [-1, 1, "Upsample", _UP], [[-1, 6], 1, "Concat", [1]],
        [-1, 3, "C2f", [512]],                                                       # 12
        [-1, 1, "Upsample", _UP], [[-1, 4], 1, "Concat", [1]],
        [-1, 3, "C2f", [256]],                                                       # 15: stride 8
        [-1, 1, _C, [256, 3, 2]], [[-1, 12], 1, "Concat", [1]],
        [-1, 3, "C2f", [512]],                                                       # 18: stride 16
        [-1, 1, _C, [512, 3, 2]], [[-1, 9], 1, "Concat", [1]],
        [-1, 3, "C2f", [1024]],                                                      # 21: stride 32
        [[15, 18, 21], 1, "YOLOv8Head", ["nc", "reg_max", "stride"]],
    ],
}


CONFIGS = {"yolov5n": YOLOV5N, "yolov8n": YOLOV8N}


def create(arch: str, num_classes: int = 10):
    """The mindyolo network ``arch`` (a key of ``CONFIGS``; inference mode, mindyolo's initial weights)."""
    from mindyolo.models import create_model
    from mindyolo.utils.config import Config

    cfg = CONFIGS[arch]
    net = create_model(model_name=cfg["model_name"], model_cfg=Config(cfg), num_classes=num_classes)
    net.set_train(False)
    return net
