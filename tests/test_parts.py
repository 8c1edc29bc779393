"""Parts of network outputs (evaluation.parts): the slice syntax, their resolution against the network's outputs
(errors name the field), their statistics, and the parts proposed for the usual detector heads."""
from __future__ import annotations

import tomllib

import numpy as np
import pytest

from quantflow.config import OutputPart, config_from_dict
from quantflow.errors import ConfigError
from quantflow.evaluation.outputs import compare_outputs
from quantflow.evaluation.parts import head_layout, parse_slice, parts_toml, propose_parts, regions
from quantflow.evaluation.runs import region_sums
from quantflow.report.text import format_table


def test_slices_read_as_python_slices():
    assert parse_slice("0:4") == (0, 4) and parse_slice("4:") == (4, None) and parse_slice(":-1") == (None, -1)
    assert parse_slice(" 5 ") == (5, 6) and parse_slice("-1") == (-1, None)
    for bad in ("a:b", "1:2:3", "", "0.5:"):
        with pytest.raises(ValueError, match="start:stop"):
            parse_slice(bad)


def _parts(**kw) -> dict:
    return {name: OutputPart(**p) for name, p in kw.items()}


YOLOV8 = [("output0", (1, 22, 2100))]


def test_parts_resolve_against_the_output_and_its_whole_is_shown_not_gated():
    got = regions(_parts(boxes={"axis": 1, "slice": "0:4"}, scores={"axis": -2, "slice": "4:", "min_cosine": 0.98}),
                  YOLOV8, whole_min_cosine=0.99, min_cosine=0.995)
    whole, boxes, scores = got
    assert (whole.label, whole.axis, whole.gated) == ("output0", None, False)   # judged by its parts
    assert (boxes.axis, boxes.start, boxes.stop, boxes.shape, boxes.min_cosine) == (1, 0, 4, (1, 4, 2100), 0.995)
    assert (scores.start, scores.stop, scores.shape, scores.min_cosine) == (4, 22, (1, 18, 2100), 0.98)
    assert scores.where == "[:, 4:22]"
    # an output without parts is gated whole
    two = regions({}, [("a", (1, 3)), ("b", (1, 5))], whole_min_cosine=0.9)
    assert [(r.label, r.min_cosine) for r in two] == [("a", 0.9), ("b", 0.9)]
    # an SQNR limit alone: no default cosine limit on that part
    only = regions(_parts(s={"axis": 1, "slice": "4:", "min_sqnr_db": 20}), YOLOV8, None, 0.99)[1]
    assert only.min_cosine is None and only.min_sqnr_db == 20 and only.gated


@pytest.mark.parametrize("part,outputs,field,says", [
    ({"axis": 1, "slice": "0:4"}, [("a", (1, 4)), ("b", (1, 4))], "evaluation.parts.p.output", "has 2 outputs"),
    ({"output": "nope", "axis": 1, "slice": "0:4"}, YOLOV8, "evaluation.parts.p.output", "no output 'nope'"),
    ({"axis": 3, "slice": "0:4"}, YOLOV8, "evaluation.parts.p.axis", "is not an axis of output output0"),
    ({"axis": -3, "slice": "0:4"}, YOLOV8, "evaluation.parts.p.axis", "other than the batch axis"),
    ({"axis": 1, "slice": "30:"}, YOLOV8, "evaluation.parts.p.slice", "selects nothing of axis 1"),
])
def test_a_part_that_does_not_fit_names_its_field(part, outputs, field, says):
    with pytest.raises(ConfigError, match=rf"^{field}: .*{says}"):
        regions(_parts(p=part), outputs, 0.99)


def test_a_part_named_like_an_output_is_refused():
    with pytest.raises(ConfigError, match="part name.*output0.*are the network's output names"):
        regions(_parts(output0={"axis": 1, "slice": "0:4"}), YOLOV8, 0.99)


def test_each_part_has_its_own_figures_and_a_lost_part_fails_by_name():
    """Box coordinates in pixels dominate the output: the whole cosine stays high while the scores are lost."""
    rng = np.random.default_rng(0)
    f = np.concatenate([rng.uniform(0, 320, (6, 4, 50)), rng.uniform(0, 1, (6, 3, 50))], 1)
    q = f.copy()
    q[:, :4] += rng.normal(0, 0.5, (6, 4, 50))             # boxes: half a pixel off
    q[:, 4:] = rng.uniform(0, 1, (6, 3, 50))               # scores: lost
    regs = regions(_parts(boxes={"axis": 1, "slice": "0:4"}, scores={"axis": 1, "slice": "4:"}), [("out", (1, 7, 50))],
                   0.99)
    stats = region_sums({"out": f}, {"out": q}, regs, 6)
    r = compare_outputs(stats, regs, [f"img{i}" for i in range(6)], 0.99)
    whole, boxes, scores = r["outputs"]
    a, b = f[:, 4:].ravel(), q[:, 4:].ravel()
    assert scores["cosine"] == pytest.approx(a @ b / np.sqrt((a @ a) * (b @ b)), abs=1e-12)
    assert whole["cosine"] > 0.999 and whole["passed"] is None      # the old gate saw this only
    assert boxes["cosine"] > 0.999 and boxes["passed"] and scores["cosine"] < 0.9 and not scores["passed"]
    assert r["failures"] == ["scores"] and not r["passed"] and r["least_cosine"] == scores["cosine"]
    r.update(metric="outputs")
    text = format_table(r)
    assert "judged by its parts" in text and "  scores " in text and text.count("FAIL") == 2   # verdict + the row
    from quantflow.evaluation.metrics import metric
    assert metric(r).failure(r).startswith("INT8 part scores of output out [:, 4:7] (cosine")
    assert metric(r).focus(r) == ["out"]


def test_region_sums_do_not_depend_on_the_batch():
    rng = np.random.default_rng(1)
    f, q = rng.normal(size=(8, 7, 30)), rng.normal(size=(8, 7, 30))
    regs = regions(_parts(s={"axis": 1, "slice": "4:"}), [("o", (1, 7, 30))], 0.99)
    whole = region_sums({"o": f}, {"o": q}, regs, 8)
    split = np.concatenate([region_sums({"o": f[:3]}, {"o": q[:3]}, regs, 3),
                            region_sums({"o": f[3:]}, {"o": q[3:]}, regs, 5)])
    assert np.array_equal(whole, split) and whole.shape == (8, 2, 5)


# ---------------------------------------------------------------------------------------- head layouts
@pytest.mark.parametrize("outputs,want", [
    ([("output0", [1, 84, 8400])], {"boxes": (1, "0:4"), "scores": (1, "4:")}),                   # YOLOv8/11
    ([("output0", [None, 22, None])], {"boxes": (1, "0:4"), "scores": (1, "4:")}),                # dynamic H/W
    ([("output", [1, 3549, 6])], {"boxes": (2, "0:4"), "objectness": (2, "4:5"), "scores": (2, "5:")}),  # YOLOX
    ([("output", [1, 25200, 85])], {"boxes": (2, "0:4"), "objectness": (2, "4:5"), "scores": (2, "5:")}),  # v5/v7
    ([("output0", [1, 37, 8400]), ("output1", [1, 32, 160, 160])],                               # YOLOv8/11-seg
     {"boxes": (1, "0:4"), "scores": (1, "4:5"), "masks": (1, "5:")}),
    ([("p3", [1, 3, 80, 80, 85]), ("p4", [1, 3, 40, 40, 85])],                                   # YOLOv5 raw heads
     {f"{o}_{k}": (4, s) for o in ("p3", "p4") for k, s in (("boxes", "0:4"), ("objectness", "4:5"), ("scores", "5:"))}),
    ([("logits", [1, 1000])], {}),                                                                # a classifier
    ([("map", [1, 1, 640, 640])], {}),                                                            # DBNet
    ([("a", [1, 22, 2100]), ("b", [1, 22, 2100])], {}),                                           # not a known head
])
def test_init_proposes_the_parts_of_the_usual_detector_heads(outputs, want):
    got = propose_parts(outputs)
    assert {k: (v["axis"], v["slice"]) for k, v in got.items()} == want
    if not want:
        assert parts_toml(got) == ""
        return
    # the proposal is a valid [evaluation.parts] table that resolves against the (static) outputs
    text = parts_toml(got, 0.98)
    data = tomllib.loads(text)
    cfg = config_from_dict({**_demo_outputs(), "evaluation": {"data_dir": "e", "metric": "outputs",
                                                               "parts": data["evaluation"]["parts"]}})
    static = [(n, tuple(d or 8400 for d in s)) for n, s in outputs]
    got_regions = regions(dict(cfg.evaluation.parts), static, 0.99)
    assert {r.part for r in got_regions if r.part} == set(want)
    assert all(r.min_cosine == 0.98 for r in got_regions if r.part)


def _demo_outputs() -> dict:
    return {"model": {"onnx": "m.onnx", "input_shape": [1, 3, 32, 32]},
            "normalization": {"mean": [0, 0, 0], "std": [1, 1, 1], "scale": "0-1", "channel_order": "RGB"},
            "calibration": {"data_dir": "c", "count": 4}, "aipp": {"template": "static_rgb888_u8.cfg"}}


def test_head_layout_reads_the_shape():
    assert head_layout((1, 84, 8400)) == "yolov8" and head_layout((1, 8400, 85)) == "yolov5"
    assert head_layout((1, 4, 8400)) is None and head_layout((1, 1000)) is None and head_layout((1, 5, 5)) is None


def test_the_fallback_ranks_layers_on_the_failing_part_where_the_analysis_measured_it():
    """A single-output detector whose class scores fail: the layer that harms the scores goes first, though the
    boxes (large pixel values) dominate the pooled figure; a failing whole output the analysis measured counts
    too, and one it did not measure (a single output has no per-output figures) is left to the parts."""
    from quantflow.evaluation.metrics import metric
    from quantflow.tasks.fallback import focus_ranking

    rows = [{"node": n, "output": {"sqnr_db": pooled}, "per_part": {"boxes": {"sqnr_db": b}, "scores": {"sqnr_db": s}}}
            for n, pooled, b, s in (("n1", 20.0, 20.0, 50.0), ("n2", 40.0, 40.0, 10.0), ("n3", 30.0, 30.0, 30.0))]
    sensitivity = {"ops": rows, "ranking": ["n1", "n3", "n2"]}
    report = {"outputs": [{"output": "output0", "part": None}, {"output": "output0", "part": "boxes"},
                          {"output": "output0", "part": "scores"}], "failures": ["scores"]}
    rerank = focus_ranking(sensitivity, metric("outputs"), {"v9": "output0"})
    assert rerank(report) == ["n2", "n3", "n1"]
    assert rerank(dict(report, failures=["scores", "boxes"])) == ["n2", "n1", "n3"]   # the least of both parts
    assert rerank(dict(report, failures=["scores", "output0"])) == ["n2", "n3", "n1"]
    # an analysis without the part's figures (an older one): the part points at its output, pooled here
    plain = {"ops": [{k: v for k, v in r.items() if k != "per_part"} for r in rows], "ranking": ["n1", "n3", "n2"]}
    assert focus_ranking(plain, metric("outputs"), {"v9": "output0"})(report) == ["n1", "n3", "n2"]


def test_the_fallback_ranks_layers_on_the_output_a_failing_part_belongs_to():
    """The per-layer analysis names outputs as the graph IR does (v13, v20); the gate as the model file does
    (output0, output1): a failing part of output1 ranks the layers by their harm to v20."""
    from quantflow.evaluation.metrics import metric
    from quantflow.tasks.fallback import focus_ranking

    rows = [{"node": n, "output": {"sqnr_db": pooled}, "per_output": {"v13": {"sqnr_db": a}, "v20": {"sqnr_db": b}}}
            for n, pooled, a, b in (("n1", 30.0, 20.0, 60.0), ("n2", 40.0, 50.0, 25.0), ("n3", 35.0, 45.0, 30.0))]
    sensitivity = {"ops": rows, "ranking": ["n1", "n3", "n2"]}
    report = {"outputs": [{"output": "output0", "part": None}, {"output": "output1", "part": None},
                          {"output": "output1", "part": "scores"}], "failures": ["scores"]}
    rerank = focus_ranking(sensitivity, metric("outputs"), {"v13": "output0", "v20": "output1"})
    assert rerank(report) == ["n2", "n3", "n1"]
    assert focus_ranking(sensitivity, metric("outputs"), None)(report) == ["n1", "n3", "n2"]   # no such output: pooled
    assert focus_ranking(sensitivity, metric("task"), None)({"outputs": [], "failures": ["f1"]}) == ["n1", "n3", "n2"]
