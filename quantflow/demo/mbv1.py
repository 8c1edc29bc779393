"""DigitsMobileNetV1: a MobileNetV1-style network (depthwise / pointwise, ReLU6) for the digits (3x32x32).

Stem 3x3 convolution (stride 2), then depthwise-separable blocks: 3x3 depthwise + BN + ReLU6,
1x1 pointwise + BN + ReLU6; global average pool and a Dense classifier.  Trained only briefly
(``train.steps`` in examples/mobilenet_v1_weak/quantflow.toml; the checkpoint ships in
quantflow/demo/checkpoints/) it is the weakly trained ReLU6 network on which the plain KL range fails
the gate (tests/test_fallback.py).
"""
from mindspore import nn, ops


def _conv_bn_relu6(cin: int, cout: int, k: int, stride: int = 1, group: int = 1):
    return nn.SequentialCell([
        nn.Conv2d(cin, cout, k, stride=stride, pad_mode="pad", padding=k // 2, group=group, has_bias=False),
        nn.BatchNorm2d(cout), nn.ReLU6()])


class DigitsMobileNetV1(nn.Cell):
    """3x32x32 -> ``num_classes`` logits."""

    BLOCKS = ((32, 1), (64, 2), (64, 1), (128, 2), (128, 1))  # (pointwise output channels, depthwise stride)

    def __init__(self, num_classes: int = 10):
        super().__init__()
        layers, cin = [_conv_bn_relu6(3, 16, 3, stride=2)], 16
        for cout, stride in self.BLOCKS:
            layers += [_conv_bn_relu6(cin, cin, 3, stride=stride, group=cin), _conv_bn_relu6(cin, cout, 1)]
            cin = cout
        self.features = nn.SequentialCell(layers)
        self.pool = ops.ReduceMean(keep_dims=False)
        self.classifier = nn.Dense(cin, num_classes)

    def construct(self, x):
        return self.classifier(self.pool(self.features(x), (2, 3)))


def build(num_classes: int = 10) -> DigitsMobileNetV1:
    return DigitsMobileNetV1(num_classes)
