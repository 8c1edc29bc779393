"""Small MindSpore networks in the styles of the model zoo, for the front-end and emulator tests.

Each has deterministic, non-trivial weights and BatchNorm statistics (``randomize``), so that
a wrong fold, layout or attribute shows up as a numeric difference.
"""
from __future__ import annotations

from mindspore import nn, ops

from benchmarks.zoo import randomize


def conv_bn(cin, cout, k=3, stride=1, group=1, pad_mode="pad", act=None):
    layers = [nn.Conv2d(cin, cout, k, stride=stride, pad_mode=pad_mode, padding=k // 2 if pad_mode == "pad" else 0,
                        group=group, has_bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.SequentialCell(layers)


class ResidualNet(nn.Cell):
    """The emulator test network: conv/BN/ReLU, depthwise/ReLU6, 1x1, residual Add, max pool, GAP, dense."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.c1 = conv_bn(3, 8, act=nn.ReLU)
        self.dw = conv_bn(8, 8, group=8, pad_mode="same", act=nn.ReLU6)
        self.pw = conv_bn(8, 8, k=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.mean = ops.ReduceMean(keep_dims=True)
        self.fc = nn.Dense(8, num_classes)

    def construct(self, x):
        y1 = self.c1(x)
        y4 = y1 + self.pw(self.dw(y1))
        y6 = self.mean(self.pool(y4), (2, 3))
        return self.fc(y6.reshape(y6.shape[0], -1))


class WideNet(nn.Cell):
    """A network as CANN sees a real one: a 3-channel stem and a 16-channel squeeze layer (rolled back to float16 on
    the device), wider convolutions, a depthwise one and Dense layers reading more than 16 features (INT8); a
    Dense reading 12 features (rolled back)."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = conv_bn(3, 24, stride=2, act=nn.ReLU)
        self.body = conv_bn(24, 32, act=nn.ReLU)
        self.dw = conv_bn(32, 32, group=32, act=nn.ReLU6)
        self.squeeze = conv_bn(32, 16, k=1, act=nn.ReLU)
        self.expand = conv_bn(16, 32, k=1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(32, 12)
        self.head = nn.Dense(12, num_classes)

    def construct(self, x):
        y = self.body(self.stem(x))
        y = y + self.expand(self.squeeze(self.dw(y)))
        return self.head(ops.relu(self.fc(self.flatten(self.gap(y)))))


class BasicBlock(nn.Cell):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.a = conv_bn(cin, cout, stride=stride, act=nn.ReLU)
        self.b = conv_bn(cout, cout)
        self.down = conv_bn(cin, cout, k=1, stride=stride) if stride != 1 or cin != cout else None
        self.relu = nn.ReLU()

    def construct(self, x):
        identity = self.down(x) if self.down is not None else x
        return self.relu(self.b(self.a(x)) + identity)


class ResNetStyle(nn.Cell):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = conv_bn(3, 8, k=3, stride=2, act=nn.ReLU)
        self.pool = nn.MaxPool2d(3, 2, pad_mode="same")
        self.layers = nn.SequentialCell([BasicBlock(8, 8, 1), BasicBlock(8, 16, 2)])
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(16, num_classes)

    def construct(self, x):
        return self.fc(self.flatten(self.gap(self.layers(self.pool(self.stem(x))))))


class SqueezeExcite(nn.Cell):
    def __init__(self, c):
        super().__init__()
        self.mean = ops.ReduceMean(keep_dims=True)
        self.reduce = nn.Conv2d(c, c // 2, 1, has_bias=True)
        self.expand = nn.Conv2d(c // 2, c, 1, has_bias=True)
        self.relu, self.gate = nn.ReLU(), nn.HSigmoid()

    def construct(self, x):
        return x * self.gate(self.expand(self.relu(self.reduce(self.mean(x, (2, 3))))))


class MobileNetV3Style(nn.Cell):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = conv_bn(3, 16, stride=2, act=nn.HSwish)
        self.expand = conv_bn(16, 32, k=1, act=nn.HSwish)
        self.dw = conv_bn(32, 32, k=5, group=32, act=nn.HSwish)
        self.se = SqueezeExcite(32)
        self.project = conv_bn(32, 16, k=1)
        self.head = nn.Dense(16, 24)
        self.act = nn.HSwish()
        self.drop = nn.Dropout(p=0.2)
        self.fc = nn.Dense(24, num_classes)
        self.mean = ops.ReduceMean(keep_dims=False)

    def construct(self, x):
        x = self.stem(x)
        x = x + self.project(self.se(self.dw(self.expand(x))))
        return self.fc(self.drop(self.act(self.head(self.mean(x, (2, 3))))))


class DenseLayer(nn.Cell):
    def __init__(self, cin, growth):
        super().__init__()
        self.bn, self.relu = nn.BatchNorm2d(cin), nn.ReLU()
        self.conv = nn.Conv2d(cin, growth, 3, pad_mode="pad", padding=1, has_bias=False)
        self.cat = ops.Concat(axis=1)

    def construct(self, x):
        return self.cat((x, self.conv(self.relu(self.bn(x)))))


class DenseNetStyle(nn.Cell):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = conv_bn(3, 8, act=nn.ReLU)
        self.block = nn.SequentialCell([DenseLayer(8, 4), DenseLayer(12, 4), DenseLayer(16, 4)])
        self.transition = nn.SequentialCell([nn.BatchNorm2d(20), nn.ReLU(), nn.Conv2d(20, 10, 1, has_bias=False),
                                             nn.AvgPool2d(2, 2)])
        self.gap = ops.ReduceMean(keep_dims=False)
        self.fc = nn.Dense(10, num_classes)

    def construct(self, x):
        return self.fc(self.gap(self.transition(self.block(self.stem(x))), (2, 3)))


class ShuffleUnit(nn.Cell):
    def __init__(self, c):
        super().__init__()
        half = c // 2
        self.branch = nn.SequentialCell([conv_bn(half, half, k=1, act=nn.ReLU), conv_bn(half, half, group=half),
                                         conv_bn(half, half, k=1, act=nn.ReLU)])
        self.c = c

    def construct(self, x):
        n, c, h, w = x.shape
        left = x[:, :c // 2]            # StridedSlice
        right = x[:, c // 2:]
        y = ops.concat((left, self.branch(right)), 1)
        y = y.reshape(n, 2, c // 2, h, w).transpose(0, 2, 1, 3, 4)  # channel shuffle
        return y.reshape(n, c, h, w)


class ShuffleNetStyle(nn.Cell):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = conv_bn(3, 16, stride=2, act=nn.ReLU)
        self.units = nn.SequentialCell([ShuffleUnit(16), ShuffleUnit(16)])
        self.split = ops.Split(axis=1, output_num=2)
        self.fc = nn.Dense(16, num_classes)

    def construct(self, x):
        a, b = self.split(self.units(self.stem(x)))
        y = ops.concat((b, a), 1).mean(axis=(2, 3))
        return self.fc(y)


class OpZoo(nn.Cell):
    """Ops outside the four styles: Sigmoid, SiLU, GeLU, LeakyReLU (Maximum), Minimum, Softmax, LayerNorm, Sub,
    Div, Pad, Resize, Unstack, Transpose, BroadcastTo, BatchMatMul, AvgPool 'same', dilated and 'valid'
    convolutions."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, pad_mode="valid", has_bias=True)
        self.c2 = nn.Conv2d(8, 8, 3, pad_mode="same", dilation=2, has_bias=True)
        self.silu, self.gelu, self.sig, self.leaky = nn.SiLU(), nn.GELU(), nn.Sigmoid(), nn.LeakyReLU(0.1)
        self.pad = nn.Pad(((0, 0), (0, 0), (1, 2), (2, 1)))
        self.avg = nn.AvgPool2d(3, 2, pad_mode="same")
        self.resize = ops.ResizeNearestNeighbor((16, 16))
        self.ln = nn.LayerNorm((16,), begin_norm_axis=-1, begin_params_axis=-1)
        self.softmax = nn.Softmax(axis=-1)
        self.bmm = ops.BatchMatMul(transpose_b=True)
        self.fc = nn.Dense(64, num_classes)

    def construct(self, x):
        y = self.silu(self.c1(x))                        # 8 x 14 x 14
        y = self.gelu(self.c2(self.pad(y)))              # 8 x 17 x 17
        y = self.leaky(self.resize(self.avg(y)))         # 8 x 16 x 16
        n = y.shape[0]
        t = self.ln(y.reshape(n, 8, 16, 16).mean(axis=2))          # n x 8 x 16
        att = self.softmax(self.bmm(t, t) / 4.0)                   # n x 8 x 8
        z = ops.BatchMatMul()(att, t) - self.sig(t)                # n x 8 x 16
        parts = ops.Unstack(axis=1)(z.reshape(n, 2, 4, 16))
        w = ops.minimum(ops.broadcast_to(parts[0][:, :1], (n, 4, 16)) + parts[1], 1.5)
        return self.fc(w.transpose(0, 2, 1).reshape(n, 64))


class TokenMLP(nn.Cell):
    """ConvNeXt's block in miniature: a depthwise convolution, then Dense layers over every position, read as
    a (images x positions, channels) matrix, and back to the feature map."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 4, stride=4, has_bias=True)            # 16x16 -> 8 x 4 x 4
        self.dw = nn.Conv2d(8, 8, 3, group=8, has_bias=True)
        self.fc1, self.fc2, self.gelu = nn.Dense(8, 16), nn.Dense(16, 8), nn.GELU()
        self.head = nn.Dense(8 * 16, num_classes)

    def construct(self, x):
        y = self.stem(x)
        n = y.shape[0]
        t = ops.transpose(self.dw(y), (0, 2, 3, 1)).reshape(n * 16, 8)
        t = self.fc2(self.gelu(self.fc1(t)))
        y = y + ops.transpose(t.reshape(n, 4, 4, 8), (0, 3, 1, 2))
        return self.head(y.reshape(n, -1))


class DetectorStyle(nn.Cell):
    """A YOLO-style detector: a SiLU backbone, a feature-pyramid step (1x1 lateral convolution, nearest
    upsampling, concatenation with the finer map) and two detection heads (1x1 convolutions with
    bias, Sigmoid), each head a network output of anchors x (box, objectness, classes) channels."""

    def __init__(self, anchors=3, classes=4):
        super().__init__()
        self.s1 = conv_bn(3, 8, stride=2, act=nn.SiLU)
        self.s2 = conv_bn(8, 16, stride=2, act=nn.SiLU)
        self.s3 = conv_bn(16, 32, stride=2, act=nn.SiLU)
        self.lateral = conv_bn(32, 16, k=1, act=nn.SiLU)
        self.up = nn.Upsample(scale_factor=2.0, mode="nearest", recompute_scale_factor=True)
        self.fuse = conv_bn(32, 16, act=nn.SiLU)
        self.coarse = nn.Conv2d(32, anchors * (5 + classes), 1, has_bias=True)
        self.fine = nn.Conv2d(16, anchors * (5 + classes), 1, has_bias=True)
        self.sig = nn.Sigmoid()

    def construct(self, x):
        c2 = self.s2(self.s1(x))                                   # 16 x H/4 x W/4
        c3 = self.s3(c2)                                           # 32 x H/8 x W/8
        p2 = self.fuse(ops.concat((self.up(self.lateral(c3)), c2), 1))
        return self.sig(self.coarse(c3)), self.sig(self.fine(p2))


class AnchorDecode(nn.Cell):
    """A YOLO head's box decoding in miniature: an anchor grid from constants (coordinates tiled and
    stacked, times an int32 stride parameter: computed once when read) added to the predicted offsets,
    and Tile and Stack on tensors computed at run time."""

    def __init__(self):
        super().__init__()
        import mindspore as ms
        import numpy as np

        self.conv = nn.Conv2d(3, 4, 3, stride=4, has_bias=True)   # 16x16 -> 4 maps of 4x4
        self.centres = ms.Tensor(np.arange(4, dtype=np.float32) + 0.5)
        self.stride = ms.Parameter(ms.Tensor(np.array([4], np.int32)), requires_grad=False)

    def construct(self, x):
        f = self.conv(x)
        n = f.shape[0]
        sx = ops.tile(self.centres.reshape(1, 4), (4, 1))
        sy = ops.tile(self.centres.reshape(4, 1), (1, 4))
        grid = ops.stack((sx, sy), 0).reshape(1, 2, 16) * self.stride[0]
        xy = f[:, :2].reshape(n, 2, 16) + grid
        wh = ops.tile(f[:, 2:].reshape(n, 2, 1, 16), (1, 1, 2, 1)).reshape(n, 4, 16)
        return ops.stack((xy, wh[:, :2], wh[:, 2:]), 1)


class SliceAssignDecode(nn.Cell):
    """YOLOv5's box decoding in miniature: sigmoid predictions whose xy and wh columns are rewritten by slice
    assignment (TensorScatterUpdate in graph mode), xy against a constant grid, wh squared (Pow)."""

    def __init__(self):
        super().__init__()
        import mindspore as ms
        import numpy as np

        self.conv = nn.Conv2d(3, 12, 3, stride=4, has_bias=True)   # 16x16 -> 2 anchors x 6 values, 4x4
        g = np.stack(np.meshgrid(np.arange(4), np.arange(4)), -1).reshape(1, 1, 4, 4, 2)
        self.grid = ms.Tensor(g.astype(np.float32))
        self.anchors = ms.Tensor(np.array([[10, 13], [16, 30]], np.float32).reshape(1, 2, 1, 1, 2))

    def construct(self, x):
        f = self.conv(x)
        y = ops.transpose(f.view(f.shape[0], 2, 6, 4, 4), (0, 1, 3, 4, 2))   # N, anchors, 4, 4, 6
        y = ops.sigmoid(y)
        y[..., 0:2] = (y[..., 0:2] * 2.0 - 0.5 + self.grid) * 4.0
        y[..., 2:4] = (y[..., 2:4] * 2) ** 2 * self.anchors
        return y.view(f.shape[0], -1, 6)


class Unsupported(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def construct(self, x):
        return ops.cos(self.conv(x))


def export(net: nn.Cell, path, shape=(2, 3, 16, 16)):
    from quantflow.backends.export import export_mindir
    return export_mindir(randomize(net), shape, path)
