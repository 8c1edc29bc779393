import copy
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from quantflow.tasks.inputs import evaluation_set

from quantflow.backends.aipp import parse
from quantflow.evaluation.metrics import metric
from quantflow.evaluation.outputs import compare_outputs
from quantflow.evaluation.parts import Region
from quantflow.evaluation.runs import HeldOut, shared_images, split_held_out
from quantflow.evaluation.top1 import compare
from quantflow.frontends.mindir import read_mindir
from quantflow.quantization.passes import fold_for_quantization
from quantflow.quantization.qparams import QuantParams
from quantflow.report.text import format_table


def test_compare_arithmetic():
    labels = np.array([0, 1, 1, 0])
    fp = np.array([[2.0, 0], [0, 2], [0, 2], [2, 0]])
    q = np.array([[2.0, 0], [0, 2], [2, 0], [2, 0]])
    r = compare(fp, q, labels, threshold=0.2)
    assert r["fp32_top1"] == 1.0 and r["int8_top1"] == 0.75 and r["drop"] == 0.25
    assert r["passed"] is False and r["top1_agreement"] == 0.75
    assert r["per_class"]["1"] == {"images": 2, "fp32_top1": 1.0, "int8_top1": 0.5}
    assert compare(fp, q, labels, threshold=0.25)["passed"] is True
    text = format_table(r)
    assert "accuracy gate: FAIL" in text and "drop -25.00 points" not in text and "+25.00 points" in text


def test_compare_outputs_arithmetic():
    """Per-image sums (as output_stats keeps them) pooled per output: the cosine and SQNR of the whole output,
    its worst image, and a verdict per output against min_cosine."""
    rng = np.random.default_rng(0)
    f = rng.normal(size=(3, 2, 40))                      # images x outputs x values
    q = f.copy()
    q[1, 1] += 0.3 * rng.normal(size=40)                 # image 1 spoils output "o1"
    stats = np.stack([np.sum(f * q, 2), np.sum(f * f, 2), np.sum(q * q, 2), np.sum((f - q) ** 2, 2),
                      np.abs(f - q).max(2)], 2)
    regions = [Region(o, o, (1, 40), min_cosine=0.999) for o in ("o0", "o1")]
    r = compare_outputs(stats, regions, ["img0", "img1", "img2"], min_cosine=0.999)
    o0, o1 = r["outputs"]
    assert o0["cosine"] == 1.0 and o0["sqnr_db"] == float("inf") and o0["passed"] and o0["max_abs_diff"] == 0
    a, b = f[:, 1].ravel(), q[:, 1].ravel()
    assert o1["cosine"] == pytest.approx(a @ b / np.sqrt((a @ a) * (b @ b)), abs=1e-12) and o1["cosine"] < 0.999
    assert o1["sqnr_db"] == pytest.approx(10 * np.log10((a @ a) / ((a - b) @ (a - b))), abs=1e-9)
    assert o1["worst_image"] == "img1" and o1["worst_image_cosine"] < o1["cosine"]
    assert r["failures"] == ["o1"] and not r["passed"] and r["least_cosine"] == o1["cosine"]
    r.update(metric="outputs")
    assert "accuracy gate: FAIL" in format_table(r) and "img1" in format_table(r)
    assert metric(r).failure(r).startswith("INT8 output o1 (cosine")
    loose = [dataclasses.replace(g, min_cosine=o1["cosine"]) for g in regions]
    assert compare_outputs(stats, loose, ["a", "b", "c"], min_cosine=o1["cosine"])["passed"]


def test_demo_passes_and_a_tampered_quantization_fails(built_demo, demo_cfg):
    dirs = {k: Path(v) for k, v in json.loads((built_demo[0] / "build" / "latest.json").read_text())["artifacts"].items()}
    graph = read_mindir(dirs["graph"] / "model.mindir")
    folded = fold_for_quantization(graph)
    qp = QuantParams.load(dirs["fallback"])
    aipp = parse((dirs["aipp"] / "aipp.cfg").read_text())
    ev = evaluation_set(demo_cfg)
    good = metric("top1").evaluate(ev, demo_cfg.evaluation, graph, folded, qp, aipp)
    assert good["passed"] and good["top1_agreement"] > 0.97
    # break it: the second convolution's weights lose all but their sign
    broken = copy.deepcopy(qp)
    broken.ops[1].weight = (np.sign(broken.ops[1].weight) * 127).astype(np.int8)
    bad = metric("top1").evaluate(ev, demo_cfg.evaluation, graph, folded, broken, aipp)
    assert not bad["passed"]
    assert bad["drop"] > demo_cfg.evaluation.threshold
    assert bad["fp32_top1"] == good["fp32_top1"]


def test_a_single_class_drop_can_fail_the_gate():
    labels = np.array([0, 0, 1, 1, 2, 2, 2, 2])
    fp = np.eye(3)[labels]
    q = fp.copy()
    q[2] = [1, 0, 0]  # one of class 1's two images lost: overall drop 1/8, class 1 drop 1/2
    assert compare(fp, q, labels, threshold=0.2)["passed"]
    r = compare(fp, q, labels, threshold=0.2, max_class_drop=0.25)
    assert not r["passed"] and r["class_failures"] == ["1"]
    assert "class 1 drops 50.00 points, more than evaluation.max_class_drop 25.00" in format_table(r)


def test_a_class_without_held_out_images_is_an_error_unless_allowed(tmp_path):
    import shutil
    import tomllib

    from quantflow.config import config_from_dict
    from quantflow.errors import DataError

    repo = Path(__file__).resolve().parents[1]
    shutil.copytree(repo / "eval_data", tmp_path / "eval_data")
    shutil.rmtree(tmp_path / "eval_data" / "3")
    d = tomllib.loads((repo / "quantflow.toml").read_text())
    with pytest.raises(DataError, match=r"no held-out images for class\(es\) 3 of the model's 10"):
        evaluation_set(config_from_dict(d, root=tmp_path))
    d["evaluation"]["allow_missing_classes"] = True
    ev = evaluation_set(config_from_dict(d, root=tmp_path))
    assert 3 not in ev.labels and len(ev.paths) == len(ev.labels) > 300


def test_top5_is_reported_beside_top1_from_100_classes():
    rng = np.random.default_rng(0)
    labels = np.arange(200) % 100
    fp = rng.uniform(0, 1, size=(200, 100))
    rows = np.arange(200)
    fp[rows, labels] = 10.0                                 # FP32: every image right
    q = fp.copy()
    q[rows[:50], labels[:50]] = -1.0                        # INT8: the first 50 lose their class entirely
    q[rows[50:100], labels[50:100]] = 0.995                 # the next 50: no longer first, in the top 5 or not
    r = compare(fp, q, labels, threshold=0.5)
    assert r["fp32_top1"] == 1.0 and r["fp32_top5"] == 1.0
    best5 = np.argsort(-q, 1, kind="stable")[:, :5]
    assert r["int8_top5"] == np.mean(np.any(best5 == labels[:, None], 1)) and r["int8_top5"] < 0.8
    assert r["int8_top5"] > r["int8_top1"]
    text = format_table(r)
    assert "top-5: FP32 100.00%" in text and "shown, not gated" in text
    assert ["INT8 top-5", f"{r['int8_top5'] * 100:.2f}%"] in metric("top1").summary_rows(r)
    # fewer classes: no top-5
    assert "fp32_top5" not in compare(fp[:, :99], q[:, :99], labels % 99, threshold=0.5)


def _held(labels) -> HeldOut:
    n = len(labels)
    return HeldOut(tuple(Path(f"/e/{i:03d}.png") for i in range(n)), np.asarray(labels), tuple(f"{i:03d}" for i in
                   range(n)), (3, 8, 8), ((0,), (1,), "0-1", "RGB"), "BGR", 4)


def test_the_fallback_tunes_on_images_the_gate_does_not_judge():
    """Each class spread over both parts (floor(m * share) of a class of m to tuning, so every class is judged);
    the parts are disjoint, together the whole set, each in the folder's order."""
    labels = [0] * 7 + [1] * 2 + [2] * 1 + [3] * 10
    ev = _held(labels)
    tune, judge = split_held_out(ev, 0.5)
    assert set(tune.paths).isdisjoint(judge.paths) and len(tune) + len(judge) == len(ev)
    assert sorted(tune.paths + judge.paths) == sorted(ev.paths)
    assert sorted(set(judge.labels.tolist())) == [0, 1, 2, 3]          # every class judged
    assert [int(np.sum(tune.labels == c)) for c in range(4)] == [3, 1, 0, 5]
    assert tune.names == tuple(ev.names[int(p.stem)] for p in tune.paths)
    assert list(tune.paths) == sorted(tune.paths) and list(judge.paths) == sorted(judge.paths)
    a, b = split_held_out(ev, 0.25)
    assert len(a) == 1 + 0 + 0 + 2 and set(a.paths).isdisjoint(b.paths)


def test_the_split_is_a_seeded_shuffle_within_each_class_so_rotated_sources_do_not_alias():
    """Images made in rotation from 10 source photos (image i from photo i mod 10): every other image (the old
    split) puts the even photos on one side and the odd on the other; a seeded shuffle gives both halves photos
    of both kinds, the same halves for the same seed, others for another seed."""
    ev = _held([0] * 40)
    source = lambda part: {int(p.stem) % 10 for p in part.paths}  # noqa: E731
    alternate = {i % 10 for i in range(1, 40, 2)}
    assert alternate.isdisjoint({i % 10 for i in range(0, 40, 2)})   # the aliasing the old rule had
    tune, judge = split_held_out(ev, 0.5, seed=0)
    assert len(source(tune) & source(judge)) >= 5
    assert {i % 2 for i in source(tune)} == {0, 1} and {i % 2 for i in source(judge)} == {0, 1}
    again, _ = split_held_out(ev, 0.5, seed=0)
    other, _ = split_held_out(ev, 0.5, seed=1)
    assert again.paths == tune.paths and other.paths != tune.paths and len(other) == len(tune) == 20


def test_shared_images_finds_the_same_file_and_the_same_bytes(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for name, data in (("a/x.png", b"one"), ("a/y.png", b"two"), ("b/z.png", b"two"), ("b/w.png", b"six")):
        (tmp_path / name).write_bytes(data)
    a = [tmp_path / "a/x.png", tmp_path / "a/y.png"]
    b = [tmp_path / "b/z.png", tmp_path / "b/w.png", tmp_path / "a/../a/x.png"]
    assert shared_images(a, b) == sorted([(tmp_path / "a/x.png", tmp_path / "a/../a/x.png"),
                                          (tmp_path / "a/y.png", tmp_path / "b/z.png")])
    assert shared_images(a[:1], b[:2]) == []
