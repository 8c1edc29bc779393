"""The release gate (issue 28): bootstrap intervals, the three verdicts, the fallback's stopping rule, the baseline,
the JUnit and Markdown results.  Quick: synthetic per-image statistics through the metrics' own judging functions;
the end-to-end builds are in test_release_gate_build.py (slow)."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from quantflow.config import EvaluationSection, OutputPart
from quantflow.errors import DataError
from quantflow.evaluation import baseline, intervals
from quantflow.evaluation.detection import Detection
from quantflow.evaluation.intervals import FAIL, PASS, UNDECIDED
from quantflow.evaluation.outputs import judged_outputs
from quantflow.evaluation.parts import regions
from quantflow.evaluation.runs import region_sums
from quantflow.evaluation.top1 import judged
from quantflow.evaluation.verdicts import DRAWS, rejudge
from quantflow.quantization.fallback import roll_back
from quantflow.quantization.qparams import QuantizedOp, QuantParams
from quantflow.report import ci

N = 60


def _limits(**kw) -> EvaluationSection:
    return EvaluationSection(data_dir=Path("e"), metric="outputs", **kw)


PARTS = {"boxes": OutputPart(axis=1, slice="0:4", min_cosine=0.5), "scores": OutputPart(axis=1, slice="4:",
                                                                                        min_cosine=0.5)}


def _arrays(noise: float, seed: int = 0, n: int = N):
    """FP32 and INT8 of an output [n, 7, 30] whose part "scores" (rows 4:) gets INT8 noise of ``noise`` (per image
    a random share of it), the boxes rows a little."""
    rng = np.random.default_rng(seed)
    f = rng.normal(0, 1, (n, 7, 30))
    q = f + rng.normal(0, 0.01, f.shape)
    q[:, 4:] += rng.normal(0, 1, (n, 3, 30)) * noise * rng.uniform(0, 2, (n, 1, 1))
    return f, q


def _stats(noise: float, seed: int = 0, n: int = N, parts=None):
    f, q = _arrays(noise, seed, n)
    regs = regions(dict(PARTS, **(parts or {})), [("out", (1, 7, 30))], 0.5)
    return region_sums({"out": f}, {"out": q}, regs, n), regs


def _outputs(noise: float, seed: int = 0, parts=None, **limits) -> dict:
    stats, regs = _stats(noise, seed, parts=parts)
    return judged_outputs(stats, regs, [f"i{k}.png" for k in range(N)], np.zeros(N, int), _limits(**limits))


def _scores(report: dict) -> dict:
    return next(f for f in report["figures"] if f["id"] == "scores cosine")


# ------------------------------------------------------------------------------------------------ bootstrap
def test_the_bootstrap_of_a_mean_has_the_known_spread_and_is_reproducible():
    """The bootstrap distribution of a sample mean has the spread s / sqrt(n) (s: the sample's standard deviation,
    the plug-in estimate); the interval is about mean +- 1.96 s / sqrt(n); the same seed draws the same."""
    rng = np.random.default_rng(5)
    x = rng.normal(3.0, 2.0, 400)
    r = intervals.resampling(np.zeros(400, int), 4000, 0, 0.95)
    draws = intervals.mean_replicates(r, x)
    se = x.std() / np.sqrt(len(x))
    assert draws.std() == pytest.approx(se, rel=0.06)
    lo, hi = intervals.interval(draws, 0.95)
    assert lo == pytest.approx(x.mean() - 1.96 * se, abs=0.25 * se)
    assert hi == pytest.approx(x.mean() + 1.96 * se, abs=0.25 * se)
    again = intervals.resampling(np.zeros(400, int), 4000, 0, 0.95)
    other = intervals.resampling(np.zeros(400, int), 4000, 1, 0.95)
    assert np.array_equal(r.counts, again.counts) and not np.array_equal(r.counts, other.counts)


def test_the_draws_are_stratified_and_paired():
    """Every draw keeps each class's image count; FP32 and INT8 of an image are drawn together (one count per
    image), so a figure of the difference is the mean of the per-image differences."""
    labels = np.array([0] * 5 + [1] * 12 + [2] * 3)
    r = intervals.resampling(labels, 300, 7, 0.9)
    for c in range(3):
        assert (r.counts[:, labels == c].sum(1) == np.sum(labels == c)).all()
    fp, q = np.random.default_rng(0).uniform(size=(2, 20))
    assert np.allclose(intervals.mean_replicates(r, fp - q),
                       intervals.mean_replicates(r, fp) - intervals.mean_replicates(r, q))


def test_region_draws_resum_the_per_image_sums():
    """A draw's cosine is the cosine over the drawn images (repeats counted) computed from the outputs themselves."""
    stats, regs = _stats(0.3, n=10)
    r = intervals.resampling(np.zeros(10, int), 5, 3, 0.95)
    cos, _ = intervals.region_replicates(r, stats)
    f, q = _arrays(0.3, n=10)
    pick = np.repeat(np.arange(10), r.counts[2])
    a, b = f[pick, 4:].ravel(), q[pick, 4:].ravel()
    k = [x.label for x in regs].index("scores")
    assert cos[2, k] == pytest.approx(a @ b / np.sqrt((a @ a) * (b @ b)))


def test_a_per_image_task_metric_is_summarized_over_draws_with_repeats():
    """Detection's records are per image; a draw repeating an image counts its detections twice."""
    recs = [{"fp32": 3, "int8": 2, "matched": 2}, {"fp32": 1, "int8": 1, "matched": 0}]
    numbers = Detection(labels=False).summarize([recs[0], recs[0], recs[1]])
    assert numbers["f1"] == pytest.approx(2 * 4 / (7 + 5)) and numbers["fp32_detections"] == 7


def test_the_images_that_would_decide_a_figure():
    """The half-width on the limit's side shrinks as 1/sqrt(n): 0.1 wide at 100 images reaches 0.05 at 400."""
    assert intervals.decide_images(0.5, 0.4, 0.55, 0.45, 100) == 400
    assert intervals.decide_images(0.44, 0.35, 0.46, 0.45, 100) == 400
    assert intervals.decide_images(0.45, 0.4, 0.5, 0.45, 100) is None       # on its limit


# ------------------------------------------------------------------------------------------------ verdicts
def test_pass_fail_and_undecided_by_the_limit_against_the_interval():
    """One measurement; limits below its interval, above it and inside it give PASS, FAIL and UNDECIDED."""
    f = _scores(_outputs(0.3))
    lo, hi, value = f["low"], f["high"], f["value"]
    assert lo < value < hi
    verdicts = {}
    for name, limit in (("below", lo - 0.001), ("above", hi + 0.001), ("inside", (value + hi) / 2)):
        r = _outputs(0.3, parts={"scores": OutputPart(axis=1, slice="4:", min_cosine=limit)})
        g = _scores(r)
        assert (g["low"], g["high"]) == (lo, hi)                          # the interval does not depend on the limit
        verdicts[name] = (g["verdict"], r["verdict"], r["passed"], g["decide_images"])
    assert verdicts["below"] == (PASS, PASS, True, None)
    assert verdicts["above"][:3] == (FAIL, FAIL, False)
    undecided = verdicts["inside"]
    assert undecided[:3] == (UNDECIDED, UNDECIDED, False) and undecided[3] > N
    # what UNDECIDED does to the build
    inside = OutputPart(axis=1, slice="4:", min_cosine=(value + hi) / 2)
    for how, passed in (("fail", False), ("pass", True), ("warn", True)):
        r = _outputs(0.3, parts={"scores": inside}, on_undecided=how)
        assert r["verdict"] == UNDECIDED and r["passed"] is passed and r["undecided"] == ["scores"]


def test_top1_drop_gets_an_interval_and_the_fidelity_of_its_output():
    rng = np.random.default_rng(2)
    labels = np.repeat(np.arange(4), 25)
    fp = np.eye(4)[labels] * 3 + rng.normal(0, 1, (100, 4))
    q = fp + rng.normal(0, 0.8, fp.shape)
    lim = EvaluationSection(data_dir=Path("e"), threshold=0.05, max_class_drop=0.3)
    r = judged(fp, q, labels, lim, "logits")
    drop = r["figures"][0]
    assert drop["id"] == "drop" and drop["low"] <= r["drop"] <= drop["high"]
    assert [f["id"] for f in r["figures"][1:]] == [f"class {c} drop" for c in range(4)]
    diff = (fp.argmax(1) == labels).astype(float) - (q.argmax(1) == labels)
    assert r[DRAWS]["drop"].mean() == pytest.approx(diff.mean(), abs=0.01)
    (row,) = r["outputs"]
    assert row["output"] == "logits" and row["passed"] is None
    assert row["cosine_interval"][0] <= row["cosine"] <= row["cosine_interval"][1]
    assert row["cosine"] == pytest.approx(np.sum(fp * q) / np.sqrt(np.sum(fp * fp) * np.sum(q * q)))


# ------------------------------------------------------------------------------------------------ fallback
def _qparams(n=4) -> QuantParams:
    return QuantParams("kl", [QuantizedOp(node=f"n{i}", scope=f"layer{i}", op="Conv2D", input=f"t{i}", scale_d=0.1,
                                          offset_d=0, scale_w=np.ones(2), channel_axis=0,
                                          weight=np.ones((2, 1, 1, 1), np.int8), bias=np.zeros(2, np.int32),
                                          deq_scale=np.full(2, 0.1, np.float32)) for i in range(n)])


def test_the_fallback_stops_once_what_is_left_is_within_the_interval():
    """Two culprit layers add noise to the scores; with both rolled back what is left is noise around the limit
    (the point figure below it, the interval straddling it): UNDECIDED, and the roll-back stops there instead of
    rolling more layers back for noise."""
    base = _scores(_outputs(0.3))
    limit = (base["value"] + base["high"]) / 2                   # the point fails, the interval straddles
    part = {"scores": OutputPart(axis=1, slice="4:", min_cosine=limit)}

    def check(qp):
        left = len({"n0", "n1"} & {q.node for q in qp.ops})
        return _outputs(0.3 + 1.0 * left, parts=part)

    ranking = ["n0", "n1", "n2", "n3"]
    selected, steps = roll_back(_qparams(), ranking, check, max_ops=4, fields=("least_cosine", "failures"),
                                settled=lambda r, _looks: intervals.settled(r["verdict"]))
    assert [s["verdict"] for s in steps] == [FAIL, FAIL, UNDECIDED]
    assert [f["node"] for f in steps[-1]["float_ops"]] == ["n0", "n1"] and steps[-1]["passed"] is True
    assert steps[-1]["least_cosine"] < limit                      # the point figure alone would roll back more
    assert [q.node for q in selected.ops] == ["n2", "n3"]


def _improves(report, before):
    """tasks.fallback's trial rule: whether the figures came closer to their limits."""
    return intervals.shortfall(report["figures"]) < intervals.shortfall(before["figures"])


def test_when_undecided_fails_the_build_the_fallback_goes_on_while_each_layer_helps():
    """With ``on_undecided = "fail"`` an UNDECIDED check does not stop the roll-back: n2, which lowers the noise a
    little, is kept; n3, which changes nothing, is put back, and with no candidate left the roll-back stops."""
    base = _scores(_outputs(0.3))
    limit = (base["value"] + base["high"]) / 2
    part = {"scores": OutputPart(axis=1, slice="4:", min_cosine=limit)}

    def check(qp):
        int8 = {q.node for q in qp.ops}
        return _outputs(0.3 + 1.0 * len({"n0", "n1"} & int8) + 0.1 * ("n2" in int8), parts=part)

    selected, steps = roll_back(_qparams(), ["n0", "n1", "n2", "n3"], check, max_ops=4,
                                fields=("least_cosine", "failures"),
                                settled=lambda r, _looks: intervals.settled(r["verdict"], "fail"), improves=_improves)
    assert [s["verdict"] for s in steps] == [FAIL, FAIL, FAIL, UNDECIDED, UNDECIDED]
    assert [s.get("undone", False) for s in steps] == [False, False, False, False, True]
    assert [f["node"] for f in steps[-1]["float_ops"]] == ["n0", "n1", "n2", "n3"]
    assert [q.node for q in selected.ops] == ["n3"] == [q.node for q in _qparams().ops
                                                        if q.node not in {"n0", "n1", "n2"}]
    # the kept step is closer than the one before it, the undone one is not closer than the kept one
    reports = [check(_qparams().without(["n0", "n1"][:k] + (["n2"] if k > 2 else []), "t")) for k in (2, 3)]
    assert intervals.shortfall(reports[1]["figures"]) < intervals.shortfall(reports[0]["figures"])


def test_a_layer_that_does_not_help_is_put_back_and_the_next_one_tried():
    """Past an UNDECIDED check (on_undecided = "fail") n1, n2 and n3 change nothing: each is tried, put back, and the
    roll-back stops after ``patience`` unhelpful trials in a row with only n0 in float16."""
    base = _scores(_outputs(0.3))
    part = {"scores": OutputPart(axis=1, slice="4:", min_cosine=(base["value"] + base["high"]) / 2)}

    def check(qp):
        return _outputs(0.3 + 1.0 * len({"n0"} & {q.node for q in qp.ops}), parts=part)

    selected, steps = roll_back(_qparams(), ["n0", "n1", "n2", "n3"], check, max_ops=4,
                                fields=("least_cosine",), settled=lambda r, _looks: intervals.settled(r["verdict"], "fail"),
                                improves=_improves, patience=2)
    assert [s["verdict"] for s in steps] == [FAIL, UNDECIDED, UNDECIDED, UNDECIDED]
    assert [s.get("undone", False) for s in steps] == [False, False, True, True]
    assert [[f["node"] for f in s["float_ops"]] for s in steps[2:]] == [["n0", "n1"], ["n0", "n2"]]
    assert [q.node for q in selected.ops] == ["n1", "n2", "n3"]
    # under "warn" the UNDECIDED check settles at once, the trial rule never runs
    _, warned = roll_back(_qparams(), ["n0", "n1", "n2", "n3"], check, max_ops=4, fields=("least_cosine",),
                          settled=lambda r, _looks: intervals.settled(r["verdict"], "warn"), improves=_improves)
    assert [s["verdict"] for s in warned] == [FAIL, UNDECIDED] and not any(s.get("undone") for s in warned)


def test_a_layer_that_does_not_help_a_failing_check_is_not_shipped_in_float16():
    """The ranking puts n1 first, but only n0 carries the error: n1's trial brings the failing check no closer, so
    it is put back and n0 tried next; the selected parameters keep n1 in INT8."""
    base = _scores(_outputs(0.3))
    part = {"scores": OutputPart(axis=1, slice="4:", min_cosine=base["high"])}

    def check(qp):
        return _outputs(0.3 + 3.0 * ("n0" in {q.node for q in qp.ops}), parts=part)

    selected, steps = roll_back(_qparams(), ["n1", "n0", "n2", "n3"], check, max_ops=4, fields=("least_cosine",),
                                settled=lambda r, _looks: intervals.settled(r["verdict"], "pass"), improves=_improves)
    assert [s["verdict"] for s in steps][:2] == [FAIL, FAIL] and steps[1]["undone"]
    assert [f["node"] for f in steps[2]["float_ops"]] == ["n0"] and steps[2]["passed"]
    assert [q.node for q in selected.ops] == ["n1", "n2", "n3"]


def test_the_shortfall_is_the_distance_of_each_deciding_bound_past_its_limit():
    f = lambda v, lo, hi, limit, kind, gated=True: {"value": v, "low": lo, "high": hi, "limit": limit,  # noqa: E731
                                                    "kind": kind, "gated": gated}
    assert intervals.shortfall([f(0.95, 0.9, 0.97, 0.92, "min")]) == pytest.approx(0.02 / 0.92)
    assert intervals.shortfall([f(0.01, 0.0, 0.03, 0.02, "max")]) == pytest.approx(0.01 / 0.02)
    assert intervals.shortfall([f(0.5, 0.45, 0.6, 0.4, "min"), f(0.1, None, None, 0.0, "max")]) == pytest.approx(0.1)
    assert intervals.shortfall([f(0.1, 0.0, 0.3, 0.9, "min", gated=False)]) == 0.0
    assert intervals.shortfall([f(None, None, None, 0.9, "min")]) == float("inf")
    assert intervals.settled(UNDECIDED) and not intervals.settled(UNDECIDED, "fail")
    assert intervals.settled(PASS, "fail") and not intervals.settled(FAIL, "warn")


# ------------------------------------------------------------------------------------------------ baseline
def _with_images(report: dict, names) -> tuple[dict, dict]:
    draws = report.pop(DRAWS)
    report.update(metric="outputs", held_out={"images": list(names), "sha256": [f"h{n}" for n in names],
                                              "tuning_images": [], "tuning_source": None})
    return report, draws


def test_a_worse_build_fails_against_its_baseline_and_a_build_against_itself_passes():
    names = [f"i{k}" for k in range(N)]
    good, good_draws = _with_images(_outputs(0.2), names)
    worse, worse_draws = _with_images(_outputs(0.35), names)
    same, same_draws = _with_images(_outputs(0.2), names)
    assert worse["verdict"] == PASS                               # both meet the limit: only the baseline fails it
    rejudge(baseline.compare(same, same_draws, good, good_draws, Path("base")))
    assert same["verdict"] == PASS and same["baseline"]["paired"] and not same["worse"]
    rejudge(baseline.compare(worse, worse_draws, good, good_draws, Path("base")))
    assert worse["verdict"] == FAIL and not worse["passed"] and worse["worse"] == ["scores"]
    f = _scores(worse)
    assert f["baseline"]["worse"] and f["baseline"]["method"] == "paired bootstrap" and f["baseline"]["high"] < 0
    assert "worse than the baseline base: scores cosine" in __import__("quantflow.evaluation.verdicts",
                                                                     fromlist=["explain"]).explain(worse, None)
    # without the baseline's draws: its figure against this build's interval
    again, again_draws = _with_images(_outputs(0.35), names)
    rejudge(baseline.compare(again, again_draws, good, None, Path("base")))
    assert not again["baseline"]["paired"] and _scores(again)["baseline"]["worse"] is (
        _scores(again)["high"] < _scores(good)["value"])


def test_a_baseline_on_other_held_out_images_is_a_clear_error():
    good, good_draws = _with_images(_outputs(0.2), [f"i{k}" for k in range(N)])
    other, other_draws = _with_images(_outputs(0.2), [f"i{k}" for k in range(1, N)] + ["new.png"])
    with pytest.raises(DataError, match=r"1 only in the baseline \(e.g. i0\); 1 only in this build \(e.g. new.png\)"):
        baseline.compare(other, other_draws, good, good_draws, Path("base"))


def test_a_baseline_is_found_from_its_report_its_stage_folder_or_its_output_folder(tmp_path):
    import json
    stage = tmp_path / "build" / "artifacts" / "gate" / "abc"
    stage.mkdir(parents=True)
    (stage / "accuracy_report.json").write_text("{}")
    (tmp_path / "build" / "latest.json").write_text(json.dumps({"accuracy_report": str(stage / "accuracy_report.txt")}))
    for p in (stage / "accuracy_report.json", stage, tmp_path / "build", tmp_path, tmp_path / "build" / "latest.json"):
        assert baseline.locate(p) == stage / "accuracy_report.json"
    from quantflow.errors import ConfigError
    with pytest.raises(ConfigError, match="evaluation.baseline: .* is neither"):
        baseline.locate(tmp_path / "nothing")


# ------------------------------------------------------------------------------------------------ CI files
def test_the_junit_file_parses_and_lists_each_gated_figure():
    hi = _scores(_outputs(0.3))["high"]
    r = _outputs(0.3, parts={"scores": OutputPart(axis=1, slice="4:", min_cosine=hi + 0.001),
                             "boxes": OutputPart(axis=1, slice="0:4", min_cosine=0.5, min_sqnr_db=10)})
    r.update(metric="outputs")
    suite = ET.fromstring(ci.junit(r))
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [f["figure"] for f in r["figures"]] == [
        "boxes cosine", "boxes SQNR dB", "scores cosine"]
    failed = {c.get("name"): c.find("failure") for c in cases}
    assert failed["boxes cosine"] is None and failed["scores cosine"] is not None
    assert failed["scores cosine"].get("message") == intervals.line(_scores(r))
    assert suite.get("tests") == "3" and suite.get("failures") == "1"
    md = ci.markdown(r)
    assert "| scores cosine |" in md and "FAIL" in md and "| output / part | cosine |" in md


def test_an_undecided_figure_fails_its_junit_case_only_when_undecided_fails_the_build():
    base = _scores(_outputs(0.3))
    inside = {"scores": OutputPart(axis=1, slice="4:", min_cosine=(base["value"] + base["high"]) / 2)}
    for how, fails in (("fail", True), ("warn", False), ("pass", False)):
        r = _outputs(0.3, parts=inside, on_undecided=how)
        case = next(c for c in ET.fromstring(ci.junit(r)).findall("testcase") if c.get("name") == "scores cosine")
        assert (case.find("failure") is not None) is fails
        assert fails or "UNDECIDED" in case.find("system-out").text


def test_every_report_shows_each_figure_with_its_interval_and_verdict():
    """The text report and report.html list each gated figure with its interval and verdict, and the outputs'
    fidelity with their intervals."""
    from quantflow.report.html import render
    from quantflow.report.text import format_table

    r = _outputs(0.3)
    r.pop(DRAWS)
    r.update(metric="outputs", quantized_ops=2, calibration_method="mse")
    f = _scores(r)
    text = format_table(r)
    assert f"    {intervals.line(f)}" in text.splitlines()
    assert f"[{f['low']:.5f}, {f['high']:.5f}]" in text                   # the scores row's cosine interval
    page = render("t", r, None, {}, None)
    assert "<th>95% interval</th>" in page and f"<td>{intervals.number(f['low'])}" not in page
    assert f"<td>[{intervals.number(f['low'])}, {intervals.number(f['high'])}]</td>" in page


def test_a_baseline_that_is_no_report_is_a_usage_error_naming_the_option(tmp_path, capsys, monkeypatch):
    from quantflow.cli.main import main
    from quantflow.config import BASELINE_ENV

    monkeypatch.chdir(tmp_path)
    assert main(["build", "--baseline", "nope"]) == 2
    assert "--baseline: nope is neither an accuracy_report.json" in capsys.readouterr().err
    assert BASELINE_ENV not in __import__("os").environ
