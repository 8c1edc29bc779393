"""DigitsNet: conv/bn/relu blocks and a dense head, in MindSpore.

Sized for MindSpore's CPU kernels (about 0.8 M multiply-adds per image).  The stem reads the 3 colour channels,
so CANN runs it in float16 (a convolution reading <= 16 channels is rolled back: README "What runs on the
device"); the two convolutions after it read 24 and 32 channels, so the device runs them in INT8, as it does
the two dense layers.
"""
from mindspore import nn


class DigitsNet(nn.Cell):
    """3x32x32 -> ``num_classes`` logits."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.SequentialCell([
            nn.Conv2d(3, 24, 3, stride=2, pad_mode="pad", padding=1, has_bias=False),  # 16x16
            nn.BatchNorm2d(24),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),                                        # 8x8
            nn.Conv2d(24, 32, 3, pad_mode="same", has_bias=True),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),                                        # 4x4
            nn.Conv2d(32, 32, 3, pad_mode="same", has_bias=True),
            nn.BatchNorm2d(32),
            nn.ReLU(),
        ])
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(32 * 4 * 4, 64)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(64, num_classes)

    def construct(self, x):
        x = self.features(x)
        x = self.flatten(x)
        x = self.relu(self.fc1(x))
        return self.fc2(x)


def build(num_classes: int = 10) -> DigitsNet:
    return DigitsNet(num_classes)
