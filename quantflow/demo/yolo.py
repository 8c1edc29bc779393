"""YOLOv8-n as mindyolo builds it, for the model zoo (``quantflow.demo.zoo yolov8n``).

mindyolo (``pip install mindyolo``, Apache-2.0) ships the layers and the YOLOv8 detect head but not its
model configurations (YAML files in its repository).  ``YOLOV8N`` is the "n" scale of the YOLOv8
architecture in mindyolo's config format: depth 0.33, width 0.25, a C2f backbone with SPPF, an FPN/PAN
neck and the decoupled, anchor-free head with distribution focal loss boxes (reg_max 16) on strides 8,
16 and 32.  In inference mode the network returns the decoded predictions (batch, anchors, 4 + classes)
and the three raw head maps (batch, 4 * 16 + classes, H / stride, W / stride).
"""
from __future__ import annotations

_C = "ConvNormAct"
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
        [-1, 1, "Upsample", ["None", 2, "'nearest'"]], [[-1, 6], 1, "Concat", [1]],
        [-1, 3, "C2f", [512]],                                                       # 12
        [-1, 1, "Upsample", ["None", 2, "'nearest'"]], [[-1, 4], 1, "Concat", [1]],
        [-1, 3, "C2f", [256]],                                                       # 15: stride 8
        [-1, 1, _C, [256, 3, 2]], [[-1, 12], 1, "Concat", [1]],
        [-1, 3, "C2f", [512]],                                                       # 18: stride 16
        [-1, 1, _C, [512, 3, 2]], [[-1, 9], 1, "Concat", [1]],
        [-1, 3, "C2f", [1024]],                                                      # 21: stride 32
        [[15, 18, 21], 1, "YOLOv8Head", ["nc", "reg_max", "stride"]],
    ],
}


def yolov8n(num_classes: int = 10):
    """The mindyolo network (inference mode), mindyolo's own initial weights."""
    from mindyolo.models import create_model
    from mindyolo.utils.config import Config

    net = create_model(model_name="yolov8", model_cfg=Config(YOLOV8N), num_classes=num_classes)
    net.set_train(False)
    return net
