"""DigitsMobileNetV2: a residual MobileNetV2-style network for the digits demo (3x32x32 input).

Stem convolution (stride 2) then inverted-residual blocks: 1x1 expansion + BN + ReLU6, 3x3
depthwise (group = channels) + BN + ReLU6, 1x1 projection + BN, and a residual Add when the
block keeps its shape; a 1x1 head + ReLU6, global average pool and a Dense classifier.
About 1.2 M multiply-adds per image, sized for MindSpore's CPU kernels.
"""
from mindspore import nn, ops


def _conv_bn(cin: int, cout: int, k: int = 1, stride: int = 1, group: int = 1, relu6: bool = True):
    layers = [nn.Conv2d(cin, cout, k, stride=stride, pad_mode="pad", padding=k // 2, group=group, has_bias=False),
              nn.BatchNorm2d(cout)]
    if relu6:
        layers.append(nn.ReLU6())
    return nn.SequentialCell(layers)


class InvertedResidual(nn.Cell):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        self.block = nn.SequentialCell([
            _conv_bn(cin, hidden),                                      # 1x1 expansion
            _conv_bn(hidden, hidden, k=3, stride=stride, group=hidden),  # 3x3 depthwise
            _conv_bn(hidden, cout, relu6=False),                        # 1x1 linear projection
        ])
        self.residual = stride == 1 and cin == cout

    def construct(self, x):
        y = self.block(x)
        return x + y if self.residual else y


class DigitsMobileNetV2(nn.Cell):
    """3x32x32 -> ``num_classes`` logits."""

    # (output channels, stride, expansion) per block; stride-1 blocks of equal width are residual
    BLOCKS = ((16, 1, 2), (24, 2, 2), (24, 1, 3), (32, 2, 3), (32, 1, 3))

    def __init__(self, num_classes: int = 10):
        super().__init__()
        layers, cin = [_conv_bn(3, 16, k=3, stride=2)], 16        # 16x16
        for cout, stride, expand in self.BLOCKS:
            layers.append(InvertedResidual(cin, cout, stride, expand))
            cin = cout
        layers.append(_conv_bn(cin, 64))                             # 1x1 head at 4x4
        self.features = nn.SequentialCell(layers)
        self.pool = ops.ReduceMean(keep_dims=False)
        self.classifier = nn.Dense(64, num_classes)

    def construct(self, x):
        return self.classifier(self.pool(self.features(x), (2, 3)))


def build(num_classes: int = 10) -> DigitsMobileNetV2:
    return DigitsMobileNetV2(num_classes)
