"""One-channel masks under evaluation.metric = "segmentation" (evaluation/segmentation.py): [N, 1, H, W] and
[N, H, W, 1] sigmoid maps or logits read as foreground above 0.5, the foreground's IoU (``miou``) and the pixel
agreement on hand-built masks; ``changed`` (pixels whose class INT8 changes) for masks and class maps; how
``quantflow init`` tells a mask from a DB text map (evaluation/heads.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from quantflow.errors import ConfigError
from quantflow.evaluation.heads import recognise
from quantflow.evaluation.segmentation import Segmentation
from quantflow.evaluation.task import Batch, TaskMetric

# two 4x4 images: FP32's foreground and INT8's (1 = person)
FP = np.array([[[0, 1, 1, 0],
                [0, 1, 1, 0],
                [0, 1, 1, 0],
                [0, 0, 0, 0]],
               [[0, 0, 0, 0],         # no person in FP32 ...
                [0, 0, 0, 0],
                [0, 0, 0, 0],
                [0, 0, 0, 0]]], bool)
Q = np.array([[[0, 1, 1, 1],          # one pixel added,
               [0, 1, 1, 0],
               [0, 0, 1, 0],          # one lost
               [0, 0, 0, 0]],
              [[0, 0, 0, 0],          # ... INT8 finds two pixels
               [0, 0, 0, 0],
               [0, 0, 1, 1],
               [0, 0, 0, 0]]], bool)


def _batch(n, h=4, w=4):
    paths = tuple(Path("/data") / f"{k}.png" for k in range(n))
    return Batch(paths, tuple(p.name for p in paths), np.zeros((n, h, w, 3), np.uint8))


def _probabilities(mask, rng):
    """A sigmoid's output whose foreground (above 0.5) is ``mask``: 0.5..1 on it, 0..0.5 (0.5 excluded) off it."""
    return np.where(mask, rng.uniform(0.51, 1.0, mask.shape), rng.uniform(0.0, 0.49, mask.shape))


def _expected(f, q):
    inter, union = np.sum(f & q), np.sum(f | q)
    return inter / union, np.mean(f == q), [int(np.sum(a != b)) for a, b in zip(f, q)]


@pytest.mark.parametrize("layout", ["nchw", "nhwc", "logits"])
def test_one_channel_mask_foreground_iou_agreement_and_changed(layout):
    rng = np.random.default_rng(0)
    pf, pq = _probabilities(FP, rng), _probabilities(Q, rng)
    options = {}
    if layout == "nchw":
        f, q = pf[:, None], pq[:, None]
    elif layout == "nhwc":
        f, q, options = pf[..., None], pq[..., None], {"axis": 3}
    else:   # the same decisions as logits: sigmoid(x) > 0.5 where x > 0
        f, q, options = np.log(pf / (1 - pf))[:, None], np.log(pq / (1 - pq))[:, None], {"activation": "sigmoid"}
    m = TaskMetric("segmentation", options)
    records = m.record({"mask": f}, {"mask": q}, _batch(2))
    numbers = m.summarize(records)
    iou, agreement, changed = _expected(FP, Q)
    # by hand: intersection 5 (6 FP32 pixels, one lost), union 6 + 1 added + 2 on the empty image = 9
    assert numbers["miou"] == pytest.approx(iou) == pytest.approx(5 / 9)
    assert numbers["pixel_agreement"] == pytest.approx(agreement) == pytest.approx(28 / 32)
    assert numbers["classes"] == 1
    metric = Segmentation(**options)
    assert [metric.changed(r) for r in records] == changed == [2, 2] and Segmentation.outcome == "pixels"
    # any flat list of records (a bootstrap draw): the empty image twice
    again = m.summarize([records[1], records[1]])
    assert again["miou"] is None and again["pixel_agreement"] == pytest.approx(14 / 16)


def test_threshold_and_no_foreground_anywhere():
    f = np.full((1, 1, 4, 4), 0.3)
    q = np.full((1, 1, 4, 4), 0.3)
    q[0, 0, 0, :2] = 0.45                      # above a threshold of 0.4, below the default 0.5
    default = TaskMetric("segmentation", {})
    same = default.summarize(default.record({"m": f}, {"m": q}, _batch(1)))
    assert same["pixel_agreement"] == 1.0 and same["miou"] is None   # no foreground in FP32: not measured
    low = TaskMetric("segmentation", {"threshold": 0.4})
    rec = low.record({"m": f}, {"m": q}, _batch(1))
    assert low.summarize(rec)["pixel_agreement"] == pytest.approx(14 / 16)
    assert Segmentation(threshold=0.4).changed(rec[0]) == 2


def test_class_maps_changed_counts_pixels_whose_class_differs():
    rng = np.random.default_rng(1)
    fp_cls = rng.integers(0, 3, (2, 5, 5))
    q_cls = fp_cls.copy()
    q_cls[0, 0, :3] = (fp_cls[0, 0, :3] + 1) % 3         # 3 pixels of image 0 change class
    q_cls[1, 4, 4] = (fp_cls[1, 4, 4] + 2) % 3           # 1 of image 1
    one_hot = lambda c: np.eye(3)[c].transpose(0, 3, 1, 2)  # noqa: E731  [n, 3, H, W]
    metric = Segmentation()
    records = metric.batch({"seg": one_hot(fp_cls)}, {"seg": one_hot(q_cls)}, _batch(2, 5, 5))
    assert [metric.changed(r) for r in records] == [3, 1]
    assert metric.summarize(records)["pixel_agreement"] == pytest.approx(1 - 4 / 50)


def test_mask_errors_name_the_option():
    with pytest.raises(ConfigError, match="evaluation.options.threshold"):
        Segmentation(threshold=1.5)
    with pytest.raises(ConfigError, match="evaluation.options.activation"):
        Segmentation(activation="softmax")
    with pytest.raises(ConfigError, match=r"evaluation.options.axis: output mask \[1, 4, 4, 1\].*axis = 3"):
        Segmentation().batch({"mask": np.zeros((1, 4, 4, 1))}, {"mask": np.zeros((1, 4, 4, 1))}, _batch(1))


# ------------------------------------------------------------------------------------------------ what init sees
H = W = 64
rng = np.random.default_rng(2)


@pytest.mark.parametrize("outputs,metric,options", [
    ({"out": rng.uniform(0, 1, (1, 1, H, W))}, "text_regions", {}),               # a DB map: input size, 0..1
    ({"segment_mask": rng.uniform(0, 1, (1, 1, H, W))}, "segmentation", {}),      # the same, named as a mask
    ({"output_1": rng.uniform(0, 1, (1, H, W, 1))}, "segmentation", {"axis": 3}),  # channels last (selfie)
    ({"out": rng.uniform(0, 1, (1, 1, H // 4, W // 4))}, "segmentation", {}),     # below the input size
    ({"out": rng.normal(0, 5, (1, 1, H // 2, W // 2))}, "segmentation", {"activation": "sigmoid"}),  # logits
    ({"person": rng.normal(0, 5, (1, H, W, 1))}, "segmentation", {"axis": 3, "activation": "sigmoid"}),
    ({"out": rng.normal(0, 5, (1, 1, H, W))}, "outputs", {}),                    # logits at the input size, unnamed
    ({"out": rng.uniform(0, 1, (1, 1, H // 3, W // 3))}, "outputs", {}),          # no stride of the input
])
def test_init_tells_one_channel_masks_from_text_maps(outputs, metric, options):
    head = recognise(outputs, (1, 3, H, W))
    assert (head.metric, head.options) == (metric, options), head.what
    if metric == "segmentation":
        assert "one-channel segmentation mask" in head.what
        TaskMetric(metric, options)
