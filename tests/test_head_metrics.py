"""The shipped task metrics for the common heads (evaluation.metric = "ctc", "text_regions", "segmentation"): each
on small synthetic outputs whose answer the test computes on its own, through task.py's TaskMetric (per-image
records, summarized over any flat list of them)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from quantflow.config import config_from_dict
from quantflow.errors import ConfigError
from quantflow.evaluation import ctc
from quantflow.evaluation.shipped import SHIPPED
from quantflow.evaluation.task import Batch, TaskMetric, entry_of


def _batch(n, root=Path("/data"), h=4, w=4):
    paths = tuple(root / "lines" / f"{k}.png" for k in range(n))
    return Batch(paths, tuple(f"lines/{k}.png" for k in range(n)), np.zeros((n, h, w, 3), np.uint8))


def _scores(path, symbols, seed=0):
    """[time, symbols] scores whose per-step best is ``path`` (a softmax of one-hot logits plus noise)."""
    rng = np.random.default_rng(seed)
    logits = rng.uniform(0, 0.5, (len(path), symbols))
    logits[np.arange(len(path)), path] = 4.0
    e = np.exp(logits)
    return e / e.sum(-1, keepdims=True)


# ------------------------------------------------------------------------------------------------ ctc
FP_PATHS = [[0, 3, 3, 0, 5, 5, 5, 2, 0, 0],      # reads 3 5 2
            [1, 1, 0, 1, 4, 0, 0, 6, 6, 0],      # reads 1 1 4 6
            [0, 0, 7, 7, 0, 0, 2, 0, 0, 0]]      # reads 7 2
Q_PATHS = [[0, 3, 0, 3, 5, 5, 1, 2, 0, 0],       # reads 3 3 5 1 2: two insertions
           [1, 1, 0, 1, 4, 0, 0, 6, 6, 0],       # the same
           [0, 0, 7, 0, 0, 0, 0, 0, 0, 0]]       # reads 7: one deletion


def test_greedy_decoding_and_edit_distance():
    assert ctc.greedy(_scores(FP_PATHS[0], 8)) == (3, 5, 2)
    assert ctc.greedy(_scores(FP_PATHS[1], 8)) == (1, 1, 4, 6)     # a blank between repeats keeps both
    assert ctc.greedy(_scores(FP_PATHS[1], 8), blank=1) == (0, 4, 0, 6, 0)   # blank 1: 0 is a symbol
    assert ctc.edit_distance("kitten", "sitting") == 3 and ctc.edit_distance((), (1, 2)) == 2
    assert ctc.edit_distance((3, 3, 5, 1, 2), (3, 5, 2)) == 2


def _sequences(paths, symbols=8):
    return np.stack([_scores(p, symbols, seed=k) for k, p in enumerate(paths)])   # [n, T, C]


@pytest.mark.parametrize("layout", ["ntc", "tnc", "stacked"])
def test_ctc_agreement_and_cer_in_each_layout(layout):
    f, q = _sequences(FP_PATHS), _sequences(Q_PATHS)
    arrange = {"ntc": lambda a: a, "tnc": lambda a: a.transpose(1, 0, 2),
               "stacked": lambda a: a.reshape(-1, 1, a.shape[-1])}[layout]   # image by image, [n*T, 1, C]
    m = TaskMetric("ctc", {})
    records = m.record({"y": arrange(f)}, {"y": arrange(q)}, _batch(3))
    assert len(records) == 3                                       # one record per image
    numbers = m.summarize(records)
    reads = [ctc.greedy(s) for s in f], [ctc.greedy(s) for s in q]
    same = [a == b for a, b in zip(*reads)]
    assert numbers["agreement"] == pytest.approx(np.mean(same)) == pytest.approx(1 / 3)
    dist = sum(ctc.edit_distance(b, a) for a, b in zip(*reads))
    assert numbers["cer"] == pytest.approx(dist / sum(len(a) for a in reads[0])) == pytest.approx(3 / 9)
    # summarize reads any flat list of per-image records: a bootstrap resample with repeats
    again = m.summarize([records[1], records[1], records[0]])
    assert again["agreement"] == pytest.approx(2 / 3) and again["cer"] == pytest.approx(2 / 11)


def test_ctc_one_image_t_below_c_both_layouts():
    """[1, T, C] with T < C (PP-OCRv4 rec's [1, 40, 6625]) and [T, 1, C] (a CRNN's, run at batch 1)."""
    f, q = _scores([0, 2, 2, 9], 12), _scores([0, 2, 9, 9], 12)   # both read 2 9
    g = _scores([0, 2, 0, 2], 12)                                  # reads 2 2
    m = TaskMetric("ctc", {})
    for arrange in (lambda a: a[None], lambda a: a[:, None]):
        assert m.summarize(m.record({"o": arrange(f)}, {"o": arrange(q)}, _batch(1)))["agreement"] == 1.0
        got = m.summarize(m.record({"o": arrange(f)}, {"o": arrange(g)}, _batch(1)))
        assert got["agreement"] == 0.0 and got["cer"] == pytest.approx(1 / 2)   # 9 read as 2


def test_ctc_accuracy_against_labels(tmp_path):
    (tmp_path / "lines").mkdir()
    # a PaddleOCR rec dict: symbols 1..6 (the blank first and a space last added: 8 symbols)
    (tmp_path / "dict.txt").write_text("\n".join("abcdef") + "\n")
    # image 0 reads "c e b" in FP32, "c c e a b" in INT8; image 1 "a a d f" in both; image 2 not labelled
    (tmp_path / "lines" / "labels.txt").write_text("0.png\tceb\n1.png\taadx\n")
    m = TaskMetric("ctc", {"labels": "lines/labels.txt", "charset": "dict.txt"})
    numbers = m.summarize(m.record({"y": _sequences(FP_PATHS)}, {"y": _sequences(Q_PATHS)}, _batch(3, tmp_path)))
    # labelled: 0 (FP32 right, INT8 wrong) and 1 (both wrong: "aadf" != "aadx")
    assert numbers["labelled_images"] == 2
    assert numbers["accuracy_fp32"] == 0.5 and numbers["accuracy_int8"] == 0.0 and numbers["accuracy_drop"] == 0.5
    assert ctc.read_charset(tmp_path / "dict.txt", 8) == ["", *"abcdef", " "]
    with pytest.raises(ConfigError, match="charset"):
        ctc.read_charset(tmp_path / "dict.txt", 12)


def test_ctc_refusals():
    with pytest.raises(ConfigError, match="evaluation.options.layout"):
        TaskMetric("ctc", {"layout": "ctn"})
    with pytest.raises(ConfigError, match="charset"):
        TaskMetric("ctc", {"labels": "x.txt"})
    m = TaskMetric("ctc", {})
    with pytest.raises(ConfigError, match="no axis of the batch's 3 images"):
        m.record({"y": np.zeros((5, 2, 4))}, {"y": np.zeros((5, 2, 4))}, _batch(3))


# ------------------------------------------------------------------------------------------------ text regions
def _rect_map(rects, h=48, w=64):
    """A probability map [1, h, w]: each (x1, y1, x2, y2, p) rectangle at probability p, 0.02 elsewhere."""
    m = np.full((1, h, w), 0.02)
    for x1, y1, x2, y2, p in rects:
        m[0, y1:y2, x1:x2] = p
    return m


def _box_iou(a, b):
    ix = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def test_text_regions_boxes_matched_and_pixel_iou():
    fp = [_rect_map([(4, 4, 30, 12, 0.9), (10, 30, 50, 40, 0.8)]),
          _rect_map([(5, 5, 25, 15, 0.95)])]
    q = [_rect_map([(6, 4, 32, 12, 0.85), (10, 30, 50, 40, 0.5)]),   # shifted 2 px; the second scores 0.5 < 0.6
         _rect_map([(15, 5, 35, 15, 0.95)])]                          # shifted half its width: IoU 1/3
    assert _box_iou((4, 4, 30, 12), (6, 4, 32, 12)) >= 0.5 and _box_iou((5, 5, 25, 15), (15, 5, 35, 15)) < 0.5
    m = TaskMetric("text_regions", {})
    records = m.record({"maps": np.stack(fp)}, {"maps": np.stack(q)}, _batch(2))
    numbers = m.summarize(records)
    assert (numbers["fp32_boxes"], numbers["int8_boxes"], numbers["matched"]) == (3, 2, 1)
    assert numbers["f1"] == pytest.approx(2 * 1 / 5) and numbers["precision"] == 0.5 and numbers["recall"] == 1 / 3
    inter = sum(np.sum((a > 0.3) & (b > 0.3)) for a, b in zip(fp, q))
    union = sum(np.sum((a > 0.3) | (b > 0.3)) for a, b in zip(fp, q))
    assert numbers["pixel_iou"] == pytest.approx(inter / union)
    assert m.summarize(records * 2)["f1"] == pytest.approx(numbers["f1"])   # repeats: sums of counts
    assert TaskMetric("text_regions", {"box_thresh": 0.4}).summarize(
        m_rec := TaskMetric("text_regions", {"box_thresh": 0.4}).record(
            {"maps": np.stack(fp)}, {"maps": np.stack(q)}, _batch(2)))["int8_boxes"] == 3 and len(m_rec) == 2


# ------------------------------------------------------------------------------------------------ segmentation
def test_segmentation_miou_and_pixel_agreement():
    rng = np.random.default_rng(1)
    fp_cls = rng.integers(0, 3, (2, 8, 8))           # classes 0..2 of a 4-class head (class 3 never in FP32)
    q_cls = fp_cls.copy()
    flip = rng.random(fp_cls.shape) < 0.15
    q_cls[flip] = (q_cls[flip] + 1) % 4
    one_hot = lambda c: np.moveaxis(np.eye(4)[c], -1, 1) * 5 + rng.normal(0, 0.1, (2, 4, 8, 8))  # noqa: E731
    m = TaskMetric("segmentation", {})
    records = m.record({"seg": one_hot(fp_cls)}, {"seg": one_hot(q_cls)}, _batch(2))
    numbers = m.summarize(records)
    ious = [np.sum((fp_cls == c) & (q_cls == c)) / np.sum((fp_cls == c) | (q_cls == c)) for c in range(3)]
    assert numbers["miou"] == pytest.approx(np.mean(ious))
    assert numbers["pixel_agreement"] == pytest.approx(np.mean(fp_cls == q_cls))
    assert numbers["classes"] == 3
    same = m.summarize(m.record({"seg": one_hot(fp_cls)}, {"seg": one_hot(fp_cls)}, _batch(2)))
    assert same["miou"] == 1.0 and same["pixel_agreement"] == 1.0


# ------------------------------------------------------------------------------------------------ names, config
def _config(**evaluation) -> dict:
    return {"model": {"onnx": "m.onnx", "input_shape": [1, 3, 32, 32]},
            "normalization": {"mean": [0, 0, 0], "std": [1, 1, 1], "scale": "0-1", "channel_order": "RGB"},
            "calibration": {"data_dir": "c", "count": 4}, "aipp": {"template": "static_rgb888_u8.cfg"},
            "evaluation": {"data_dir": "e", **evaluation}}


def test_shipped_names_and_config():
    for name, entry in SHIPPED.items():
        assert entry_of(name) == entry
        assert TaskMetric(name, {}).defaults["min"]          # each has default limits
        cfg = config_from_dict(_config(metric=name))
        assert cfg.evaluation.task and cfg.evaluation.metric == name
    assert entry_of("pkg.mod:fn") == "pkg.mod:fn"
    with pytest.raises(ConfigError, match="evaluation.options.blank"):
        config_from_dict(_config(metric="ctc", options={"blank": -1}))


# ------------------------------------------------------------------------------------------------ a real sequence run
def test_ctc_on_a_time_major_network_run_image_by_image(tmp_path):
    """A CRNN [T, batch, classes] (tests/test_onnx_ops.py crnn_style) built at batch 1 and evaluated in batches of
    4: the runner hands the metric each batch's outputs stacked as [n * T, 1, C], and the ctc metric reads one
    record per image, each image's FP32 reading the one the graph gives on that image alone."""
    import cv2
    from test_onnx_ops import crnn_style

    from quantflow import aipp_templates
    from quantflow.backends.aipp import aipp_values, parse, render
    from quantflow.data.images import load_images, preprocess
    from quantflow.engine.runner import float_runner
    from quantflow.evaluation.runs import held_out, whole_outputs
    from quantflow.evaluation.shipped import per_image
    from quantflow.evaluation.task import task_run
    from quantflow.frontends.onnx_model import read_onnx
    from quantflow.quantization.calibrater import calibrate
    from quantflow.quantization.deploy import quantized_graph
    from quantflow.quantization.passes import fold_for_quantization

    rng = np.random.default_rng(0)
    for i in range(5):
        cv2.imwrite(str(tmp_path / f"{i}.png"), rng.integers(0, 256, (8, 40), dtype=np.uint8))
    graph = read_onnx(crnn_style()[0], input_shape=[1, 1, 8, 40])
    folded = fold_for_quantization(graph)
    norm = ([0.5], [0.5], "0-1", "GRAY")
    paths = sorted(tmp_path.glob("*.png"))
    qp = calibrate(folded, [preprocess(load_images(paths, 1, 8, 40), *norm)], "minmax")
    aipp = parse(render(aipp_templates.path("static_yuv400_u8.cfg"), aipp_values((1, 1, 8, 40), *norm, "GRAY")))
    ev = held_out(tmp_path, None, False, tmp_path, shape=(1, 8, 40), normalization=norm, frame_order="GRAY",
                  batch_size=4)
    _, records = task_run(ev, graph, quantized_graph(folded, qp), aipp, whole_outputs(graph), "ctc", {})
    records = per_image(records)
    assert len(records) == 5
    runner = float_runner(graph)
    alone = [runner.run(preprocess(load_images([p], 1, 8, 40), *norm))[graph.outputs[0]] for p in ev.paths]
    assert alone[0].shape[1] == 1 and alone[0].shape[0] > 1                  # [T, 1, C]
    lengths = [len(ctc.greedy(a[:, 0])) for a in alone]
    assert [r["length"] for r in records] == lengths and sum(lengths) > 5   # readings of a few symbols each
    numbers = TaskMetric("ctc", {}).summarize(records)
    assert numbers["images"] == 5 and 0 <= numbers["agreement"] <= 1
    # a checker's FP32 memo keeps each batch's outputs whole (here [n * T, 1, C]: no per-image axis to cut)
    from quantflow.evaluation.runs import Fp32Memo
    memo, deploy = Fp32Memo(graph, len(ev)), quantized_graph(folded, qp)
    fresh = task_run(ev, graph, deploy, aipp, whole_outputs(graph), "ctc", {})
    for _ in range(2):   # the first run fills the memo, the second reads it
        again = task_run(ev, graph, deploy, aipp, whole_outputs(graph), "ctc", {}, None, memo)
        assert np.array_equal(again[0], fresh[0]) and len(memo.outputs) == 2
        assert TaskMetric("ctc", {}).summarize(again[1]) == TaskMetric("ctc", {}).summarize(fresh[1])


def test_editing_a_file_the_options_name_changes_the_evaluation_key(tmp_path):
    """The ctc metric's labels and charset are read by the gate: their content is in its key (and the fallback's),
    so editing them reruns the evaluation; option values that are not files are not."""
    from types import SimpleNamespace

    from quantflow.tasks.fallback import _option_files

    (tmp_path / "labels.txt").write_text("a.png\tAB\n")
    (tmp_path / "keys.txt").write_text("A\nB\n")
    cfg = SimpleNamespace(evaluation=SimpleNamespace(options={"labels": "labels.txt", "charset": "keys.txt",
                                                              "layout": "auto", "blank": 0}),
                          path=lambda p: tmp_path / p)
    first = _option_files(cfg)
    assert sorted(first) == ["charset", "labels"]
    (tmp_path / "labels.txt").write_text("a.png\tBA\n")
    second = _option_files(cfg)
    assert second["labels"] != first["labels"] and second["charset"] == first["charset"]
