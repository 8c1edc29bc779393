"""DigitsMobileNetV3Small: a MobileNetV3-small-style network for the digits demo (3x32x32 input).

MobileNetV3-small (Howard et al., "Searching for MobileNetV3", ICCV 2019, table 2) with its own channels, kernels,
squeeze-excitations and activations, and one stride fewer for 32x32 digits: a 3x3 stem (stride 2) + BN +
hard-swish, then inverted-residual blocks: 1x1 expansion + BN + activation (when it expands), 3x3 or 5x5
depthwise + BN + activation, squeeze-excitation in most (global average pool, 1x1 reduction + ReLU, 1x1 expansion
+ hard-sigmoid, the channels multiplied by it), 1x1 linear projection + BN, and a residual Add when the block
keeps its shape; the first three blocks use ReLU, the others hard-swish.  A 1x1 head to 576 channels + BN +
hard-swish, global average pool, a Dense to 1024 + hard-swish (no BatchNorm) and the Dense classifier.

What makes MobileNetV3 hard for INT8 is all there: hard-swish tensors from -0.375 to large positive values, the
squeeze-excitation's per-image channel gains, depthwise 5x5 layers and the wide hidden Dense.
About 4.9 M multiply-adds per image and 1.5 M parameters: minutes of MindSpore's CPU training.
"""
from mindspore import nn, ops


def _act(kind: str):
    return nn.HSwish() if kind == "HS" else nn.ReLU()


def _conv_bn(cin: int, cout: int, k: int = 1, stride: int = 1, group: int = 1, act: str | None = None):
    layers = [nn.Conv2d(cin, cout, k, stride=stride, pad_mode="pad", padding=k // 2, group=group, has_bias=False),
              nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(_act(act))
    return nn.SequentialCell(layers)


def _squeeze_channels(channels: int) -> int:
    """A quarter of the channels, rounded to a multiple of 8 (as MobileNetV3's _make_divisible)."""
    return max(8, int(channels / 4 + 4) // 8 * 8)


class SqueezeExcitation(nn.Cell):
    """x * hard_sigmoid(W2 relu(W1 mean(x))): a per-image gain of every channel."""

    def __init__(self, channels: int):
        super().__init__()
        squeeze = _squeeze_channels(channels)
        self.pool = ops.ReduceMean(keep_dims=True)
        self.reduce = nn.Conv2d(channels, squeeze, 1, has_bias=True)
        self.relu = nn.ReLU()
        self.expand = nn.Conv2d(squeeze, channels, 1, has_bias=True)
        self.gate = nn.HSigmoid()

    def construct(self, x):
        return x * self.gate(self.expand(self.relu(self.reduce(self.pool(x, (2, 3))))))


class InvertedResidual(nn.Cell):
    def __init__(self, cin: int, k: int, hidden: int, cout: int, se: bool, act: str, stride: int):
        super().__init__()
        layers = [] if hidden == cin else [_conv_bn(cin, hidden, act=act)]         # 1x1 expansion
        layers.append(_conv_bn(hidden, hidden, k=k, stride=stride, group=hidden, act=act))  # depthwise
        if se:
            layers.append(SqueezeExcitation(hidden))
        layers.append(_conv_bn(hidden, cout))                                       # 1x1 linear projection
        self.block = nn.SequentialCell(layers)
        self.residual = stride == 1 and cin == cout

    def construct(self, x):
        y = self.block(x)
        return x + y if self.residual else y


class DigitsMobileNetV3Small(nn.Cell):
    """3x32x32 -> ``num_classes`` logits."""

    STEM = 16
    # (kernel, expanded channels, output channels, squeeze-excitation, activation, stride): MobileNetV3-small's own
    # table (Howard et al. 2019, table 2), its second block at stride 1 for the 32x32 input (features 16, 8, 4, 2)
    BLOCKS = ((3, 16, 16, True, "RE", 2),     # 8x8
              (3, 72, 24, False, "RE", 1),
              (3, 88, 24, False, "RE", 1),
              (5, 96, 40, True, "HS", 2),     # 4x4
              (5, 240, 40, True, "HS", 1),
              (5, 240, 40, True, "HS", 1),
              (5, 120, 48, True, "HS", 1),
              (5, 144, 48, True, "HS", 1),
              (5, 288, 96, True, "HS", 2),    # 2x2
              (5, 576, 96, True, "HS", 1),
              (5, 576, 96, True, "HS", 1))
    HEAD = 576      # the last 1x1 convolution
    HIDDEN = 1024   # the classifier's hidden Dense (no BatchNorm)

    def __init__(self, num_classes: int = 10):
        super().__init__()
        layers, cin = [_conv_bn(3, self.STEM, k=3, stride=2, act="HS")], self.STEM   # 16x16
        for k, hidden, cout, se, act, stride in self.BLOCKS:
            layers.append(InvertedResidual(cin, k, hidden, cout, se, act, stride))
            cin = cout
        layers.append(_conv_bn(cin, self.HEAD, act="HS"))                            # 1x1 head
        self.features = nn.SequentialCell(layers)
        self.pool = ops.ReduceMean(keep_dims=False)
        self.classifier = nn.SequentialCell([nn.Dense(self.HEAD, self.HIDDEN), nn.HSwish(),
                                             nn.Dense(self.HIDDEN, num_classes)])

    def construct(self, x):
        return self.classifier(self.pool(self.features(x), (2, 3)))


def build(num_classes: int = 10) -> DigitsMobileNetV3Small:
    return DigitsMobileNetV3Small(num_classes)
