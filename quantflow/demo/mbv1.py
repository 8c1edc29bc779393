"""DigitsMobileNetV1: a MobileNetV1-style network (depthwise / pointwise, ReLU6) for the digits (3x32x32).

Stem 3x3 convolution (stride 2), then depthwise-separable blocks: 3x3 depthwise + BN + ReLU6,
1x1 pointwise + BN + ReLU6; global average pool and a Dense classifier.

``train_imbalanced`` trains it and then makes the output channels of its first depthwise block ``IMBALANCE``
times apart in range (``imbalance``).  Per-channel ranges that differ by orders of magnitude are what Nagel et
al. found in MobileNets' depthwise layers ("Data-Free Quantization Through Weight Equalization and Bias
Correction", ICCV 2019, sec. 3.1 and fig. 2, there in the weights); here they are in the activations, which one
INT8 scale per tensor cannot hold.  The pointwise convolution reading that tensor (``features.2``, 24 input
channels: INT8 on the device) loses its narrow channels to an INT8 step or two whatever the range method, and the
network most of its accuracy; rolled back to float16 it is exact again.  That is
examples/mobilenet_v1_imbalanced (tests/test_fallback.py): the failing gate, the per-layer analysis that finds
the layer, the fallback that fixes it.  The imbalance is set by the weights, not by how the training went, so a
checkpoint trained on any machine has it.
"""
from pathlib import Path

import numpy as np
from mindspore import Tensor, nn, ops


def _conv_bn_relu6(cin: int, cout: int, k: int, stride: int = 1, group: int = 1):
    return nn.SequentialCell([
        nn.Conv2d(cin, cout, k, stride=stride, pad_mode="pad", padding=k // 2, group=group, has_bias=False),
        nn.BatchNorm2d(cout), nn.ReLU6()])


class DigitsMobileNetV1(nn.Cell):
    """3x32x32 -> ``num_classes`` logits."""

    STEM = 24   # the stem's output channels, which the first depthwise-separable block reads (> 16: INT8 on the device)
    BLOCKS = ((32, 1), (64, 2), (64, 1), (128, 2), (128, 1))  # (pointwise output channels, depthwise stride)

    def __init__(self, num_classes: int = 10):
        super().__init__()
        layers, cin = [_conv_bn_relu6(3, self.STEM, 3, stride=2)], self.STEM
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


IMBALANCE = 256   # how many times narrower than the widest channel the others' ranges are made


def imbalance(net: DigitsMobileNetV1, block: int = 1, factor: float = IMBALANCE) -> None:
    """Scale every output channel of depthwise block ``features.<block>`` but its widest by 1/``factor`` (its
    BatchNorm's gamma and beta: ReLU6(a y) = a ReLU6(y) wherever y <= 6) and the next pointwise convolution's
    weights for those input channels by ``factor``, so that the network computes (nearly: a y is no longer clipped
    at 6 where y > 6) what it computed, from a tensor whose channel ranges differ ``factor`` times.  The widest
    channel: the largest |gamma| (the BatchNorm's output scale)."""
    bn, pointwise = net.features[block][1], net.features[block + 1][0]
    gamma, beta = bn.gamma.asnumpy(), bn.beta.asnumpy()
    scale = np.full(gamma.shape, 1.0 / factor, np.float32)
    scale[int(np.argmax(np.abs(gamma)))] = 1.0
    bn.gamma.set_data(Tensor(gamma * scale))
    bn.beta.set_data(Tensor(beta * scale))
    w = pointwise.weight.asnumpy()
    pointwise.weight.set_data(Tensor(w / scale[None, :, None, None]))


def train_imbalanced(cfg, checkpoint_path) -> dict:
    """``quantflow.demo.train.train``, then ``imbalance`` on the trained network, saved over the checkpoint and
    measured again (examples/mobilenet_v1_imbalanced's ``train.entry``)."""
    import mindspore as ms

    from ..data.images import load_images, scan_class_folders
    from ..io.atomic import atomic_path
    from . import data
    from .train import train

    metrics = train(cfg, checkpoint_path)
    net = build(cfg.model.num_classes)
    ms.load_param_into_net(net, ms.load_checkpoint(str(checkpoint_path)), strict_load=True)
    net.set_train(False)
    imbalance(net)
    with atomic_path(Path(checkpoint_path), in_folder=True) as tmp:
        ms.save_checkpoint(net, str(tmp))
    items = scan_class_folders(cfg.path(cfg.evaluation.data_dir), cfg.model.num_classes)
    x = data.preprocess_batch(load_images([it.path for it in items], *cfg.model.input_shape[1:]))
    logits = np.concatenate([net(Tensor(x[s:s + 128])).asnumpy() for s in range(0, len(x), 128)])
    metrics["trained_heldout_top1"] = metrics["heldout_top1"]
    metrics["heldout_top1"] = float((logits.argmax(1) == np.array([it.label for it in items])).mean())
    print(f"  channel ranges of features.1 made {IMBALANCE}x apart: FP32 held-out top-1 {metrics['heldout_top1']:.4f}")
    return metrics
