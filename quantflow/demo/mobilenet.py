"""DigitsMobileNet: a small residual MobileNetV2-style network for the digits demo (3x32x32 input).

    stem      3x3 conv 3->16, stride 2, BN, ReLU6                       32x32 -> 16x16
    blocks    inverted residuals (t = expansion, s = stride):
                16 -> 16, t2, s1  (+ residual Add)                      16x16
                16 -> 24, t2, s2                                        16x16 -> 8x8
                24 -> 24, t3, s1  (+ residual Add)                      8x8
                24 -> 32, t3, s2                                        8x8 -> 4x4
                32 -> 32, t3, s1  (+ residual Add)                      4x4
              each: 1x1 expand conv + BN + ReLU6, 3x3 depthwise conv (group = channels) + BN + ReLU6,
              1x1 linear projection conv + BN, then ``x + y`` when stride 1 and in == out channels
    head      1x1 conv 32->64 + BN + ReLU6, global average pool (ReduceMean over H, W), flatten, Dense

About 1.2 M multiply-adds per image (``count_macs``), sized for MindSpore's CPU kernels, which train
the digits in about a minute with ``quantflow.demo.train:train``.
"""
from __future__ import annotations

from mindspore import nn, ops

# (output channels, stride, expansion) of the inverted-residual blocks after the stem
BLOCKS = ((16, 1, 2), (24, 2, 2), (24, 1, 3), (32, 2, 3), (32, 1, 3))
STEM_CHANNELS = 16
HEAD_CHANNELS = 64


def conv_bn(cin: int, cout: int, kernel: int = 1, stride: int = 1, group: int = 1, relu6: bool = True) -> nn.SequentialCell:
    """Conv2d (no bias, explicit padding kernel // 2) + BatchNorm2d (+ ReLU6)."""
    layers = [nn.Conv2d(cin, cout, kernel, stride=stride, pad_mode="pad", padding=kernel // 2, group=group,
                        has_bias=False),
              nn.BatchNorm2d(cout)]
    if relu6:
        layers.append(nn.ReLU6())
    return nn.SequentialCell(layers)


class InvertedResidual(nn.Cell):
    """MobileNetV2 block: 1x1 expand, 3x3 depthwise, 1x1 linear projection, residual Add when shapes agree."""

    def __init__(self, cin: int, cout: int, stride: int, expansion: int):
        super().__init__()
        hidden = cin * expansion
        self.expand = conv_bn(cin, hidden, 1)
        self.depthwise = conv_bn(hidden, hidden, 3, stride=stride, group=hidden)
        self.project = conv_bn(hidden, cout, 1, relu6=False)
        self.use_residual = stride == 1 and cin == cout

    def construct(self, x):
        y = self.project(self.depthwise(self.expand(x)))
        if self.use_residual:
            return x + y
        return y


class DigitsMobileNet(nn.Cell):
    """3x32x32 -> ``num_classes`` logits."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        layers = [conv_bn(3, STEM_CHANNELS, 3, stride=2)]
        cin = STEM_CHANNELS
        for cout, stride, expansion in BLOCKS:
            layers.append(InvertedResidual(cin, cout, stride, expansion))
            cin = cout
        layers.append(conv_bn(cin, HEAD_CHANNELS, 1))
        self.features = nn.SequentialCell(layers)
        self.pool = ops.ReduceMean(keep_dims=True)
        self.flatten = nn.Flatten()
        self.classifier = nn.Dense(HEAD_CHANNELS, num_classes)

    def construct(self, x):
        x = self.features(x)
        x = self.flatten(self.pool(x, (2, 3)))
        return self.classifier(x)


def build(num_classes: int = 10) -> DigitsMobileNet:
    return DigitsMobileNet(num_classes)


def count_macs(net: nn.Cell, height: int = 32, width: int = 32) -> int:
    """Multiply-adds per image of the Conv2d and Dense layers, in registration (= execution) order.

    Valid for networks like this one whose convolutions run one after another (the residual
    branches are identities), with ``pad_mode="pad"``.
    """
    total, h, w = 0, height, width
    for _, cell in net.cells_and_names():
        if isinstance(cell, nn.Conv2d):
            kh, kw = cell.kernel_size
            sh, sw = cell.stride
            pt, pb, pl, pr = cell.padding if isinstance(cell.padding, tuple) else (cell.padding,) * 4
            h = (h + pt + pb - kh) // sh + 1
            w = (w + pl + pr - kw) // sw + 1
            total += h * w * cell.out_channels * (cell.in_channels // cell.group) * kh * kw
        elif isinstance(cell, nn.Dense):
            total += cell.in_channels * cell.out_channels
    return total
