"""Issue 36 part 1: the fallback steers by a low-variance figure of INT8 against FP32 tied to each gated one
(quantflow.evaluation.steering), keeps going while the gate's verdict on the tuning images would not be PASS and
that figure still improves, tries the next layers after one that does not help, and ships none that did not."""
from __future__ import annotations

import numpy as np
import pytest

from quantflow.evaluation import steering
from quantflow.evaluation.intervals import FAIL, PASS, UNDECIDED, settled
from quantflow.evaluation.top1 import judged
from quantflow.quantization.fallback import roll_back
from quantflow.quantization.qparams import QuantizedOp, QuantParams
from tasks.fallback import improves


def _qparams(n=6) -> QuantParams:
    return QuantParams("kl", [QuantizedOp(node=f"n{i}", scope=f"layer{i}", op="Conv2D", input=f"t{i}", scale_d=0.1,
                                          offset_d=0, scale_w=np.ones(2), channel_axis=0,
                                          weight=np.ones((2, 1, 1, 1), np.int8), bias=np.zeros(2, np.int32),
                                          deq_scale=np.full(2, 0.1, np.float32)) for i in range(n)])


def test_the_kl_divergence_of_softmaxes():
    fp = np.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    assert steering.kl_divergence(fp, fp) == pytest.approx([0.0, 0.0], abs=1e-12)
    q = np.array([[1.0, 0.5, -1.0], [0.0, 1.0, 0.0]])
    p = np.exp(fp) / np.exp(fp).sum(1, keepdims=True)
    r = np.exp(q) / np.exp(q).sum(1, keepdims=True)
    assert steering.kl_divergence(fp, q) == pytest.approx(np.sum(p * np.log(p / r), 1))
    s = steering.top1_steering(fp, q)
    assert s["value"] == s["error"] == pytest.approx(np.mean(np.sum(p * np.log(p / r), 1)))
    assert s["flip_rate"] == 0.5     # the second image's top-1 changes (ties: the first class)


def test_the_region_figure_is_the_least_sqnr_of_the_finest_regions():
    rows = [{"output": "out", "part": None, "sqnr_db": 40.0}, {"output": "out", "part": "boxes", "sqnr_db": 45.0},
            {"output": "out", "part": "scores", "sqnr_db": 3.0}, {"output": "other", "part": None, "sqnr_db": 20.0}]
    s = steering.region_steering(rows)
    assert s["figure"] == "least SQNR dB (scores)" and s["value"] == 3.0 and s["error"] == pytest.approx(10 ** -0.3)
    assert steering.region_steering(rows[:1])["value"] == 40.0 and steering.region_steering([]) is None


def test_the_least_sqnr_of_named_sums():
    s = steering.least_sqnr({"scores": (1.0, 100.0), "boxes": (1.0, 1e4), "clean": (0.0, 5.0)})
    assert s["figure"] == "least SQNR dB (scores)" and s["value"] == pytest.approx(20.0)
    assert s["error"] == pytest.approx(0.01) and s["regions"] == {"scores": 20.0, "boxes": 40.0, "clean": np.inf}


def test_a_metric_of_its_own_steers_where_its_number_fails_and_a_part_where_the_part_fails():
    """A task metric's own figure (the detection metric's scores near the threshold) carries the parts' SQNRs: a
    check failing on f1 is judged by the metric's figure, one failing on a part by that part."""
    from quantflow.evaluation.task import steering_of

    parts = steering.region_steering([{"output": "out", "part": "boxes", "sqnr_db": 40.0},
                                      {"output": "out", "part": "scores", "sqnr_db": 3.0}])
    own = steering.least_sqnr({"scores near the threshold": (1.0, 10.0)})
    s = steering_of(own, parts)
    assert s["value"] == 10.0 and s["regions"] == {"boxes": 40.0, "scores": 3.0, "scores near the threshold": 10.0}
    assert steering_of(None, parts) is parts and steering_of(own, None)["regions"] == own["regions"]
    better_own = steering_of(steering.least_sqnr({"scores near the threshold": (1.0, 20.0)}), parts)
    better_part = steering_of(own, dict(parts, regions={"boxes": 40.0, "scores": 20.0}))
    assert improves({"steering": better_own}, {"steering": s, "failures": ["f1"]})
    assert not improves({"steering": better_part}, {"steering": s, "failures": ["f1"]})
    assert improves({"steering": better_part}, {"steering": s, "failures": ["scores"]})
    assert not improves({"steering": better_own}, {"steering": s, "failures": ["scores"]})


USER_STEERING = """
class Counted:
    def batch(self, fp32, int8, batch):
        return 1

    def summarize(self, records):
        return {"n": len(records)}

    def steering(self, records):
        return {"figure": "my error", "value": 2.0 * len(records), "error": 2.0 * len(records)}


class Garbled(Counted):
    def steering(self, records):
        return {"value": 1.0}


class Silent(Counted):
    def steering(self, records):
        return None
"""


def test_a_task_metric_class_may_give_its_own_steering_figure(tmp_path, monkeypatch):
    import sys

    from quantflow.errors import QuantflowError
    from quantflow.evaluation.task import TaskMetric

    name = f"user_steering_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_STEERING)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert TaskMetric(f"{name}:Counted", {}).steering([1, 1]) == {"figure": "my error", "value": 4.0,
                                                                       "error": 4.0, "regions": {}}
        assert TaskMetric(f"{name}:Silent", {}).steering([1]) is None
        with pytest.raises(QuantflowError, match=rf"evaluation.metric {name}:Garbled: steering returned "
                                                 r"\{'value': 1.0\}, not None or a dict"):
            TaskMetric(f"{name}:Garbled", {}).steering([1])
    finally:
        sys.modules.pop(name, None)


def test_a_trial_is_judged_by_what_the_check_fails_on():
    """The outputs a check fails on decide: a layer that lifts the failing output helps though the least SQNR (of
    an output that passes) does not move; one that only lifts a passing output does not."""
    old = {"error": 1e-3, "regions": {"a": 30.0, "b": 45.0}}
    lifts_b = {"error": 1e-3, "regions": {"a": 30.0, "b": 50.0}}
    lifts_a = {"error": 1e-3, "regions": {"a": 40.0, "b": 45.0}}
    assert steering.helps(lifts_a, old, ["a"]) and not steering.helps(lifts_b, old, ["a"])
    assert steering.helps(lifts_b, old, ["b"]) and not steering.helps(lifts_b, old, ["f1"])
    assert improves({"steering": lifts_a}, {"steering": old, "failures": ["a"]})
    assert not improves({"steering": lifts_b}, {"steering": old, "failures": [], "undecided": ["a"]})


def test_a_trial_helps_when_it_removes_enough_of_the_error():
    old = {"error": 1.0}
    assert steering.helps({"error": 0.9}, old) and not steering.helps({"error": 0.97}, old)
    assert improves({"steering": {"error": 0.5}, "figures": []}, {"steering": {"error": 1.0}, "figures": []})
    assert not improves({"steering": {"error": 0.99}}, {"steering": {"error": 1.0}})


def _top1_check(fp, q, labels):
    from pathlib import Path

    from quantflow.config import EvaluationSection

    return judged(fp, q, labels, EvaluationSection(data_dir=Path("e"), threshold=0.01))


def test_a_top1_report_carries_its_steering_figure():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 10)
    fp = rng.normal(size=(40, 4)) + 3 * np.eye(4)[labels]
    q = fp + rng.normal(0, 0.3, fp.shape)
    r = _top1_check(fp, q, labels)
    assert r["steering"]["value"] == pytest.approx(float(np.mean(steering.kl_divergence(fp, q))))
    assert r["steering"]["flip_rate"] == pytest.approx(1 - r["top1_agreement"])


def _report(err: float, limit: float, width: float) -> dict:
    """A check's report on an error: the gate's figure an error below ``limit`` with an interval of ``width``
    around it, the steering figure the error itself."""
    low, high = err - width, err + width
    verdict = PASS if high <= limit else FAIL if low > limit else UNDECIDED
    return {"passed": verdict == PASS, "verdict": verdict, "error": err,
            "figures": [{"value": err, "low": low, "high": high, "limit": limit, "kind": "max", "gated": True}],
            "steering": {"figure": "error", "value": err, "error": err}}


def _check(costs: dict, limit: float, width: float = 0.002):
    """A check whose error is the sum of the costs of the layers still INT8 (``_report``)."""
    return lambda qp: _report(sum(costs.get(q.node, 0.0) for q in qp.ops), limit, width)


def test_several_layers_that_each_cost_a_little_are_all_found_and_none_that_does_not_help_is_kept():
    """n1, n3 and n5 each cost a little; n0, n2 and n4 (ranked among them) nothing.  Each costly layer helps and is
    kept; each free one is tried, put back, and the next one tried, until the check PASSes."""
    costs = {"n1": 0.01, "n3": 0.01, "n5": 0.01}
    ranking = ["n0", "n1", "n2", "n3", "n4", "n5"]
    selected, steps = roll_back(_qparams(), ranking, _check(costs, 0.005), max_ops=5, fields=("error",),
                                settled=lambda r, _looks: settled(r["verdict"], "fail"), improves=improves)
    kept = [s for s in steps[1:] if not s.get("undone")]
    assert [f["node"] for f in kept[-1]["float_ops"]] == ["n1", "n3", "n5"] and kept[-1]["passed"]
    assert [q.node for q in selected.ops] == ["n0", "n2", "n4"]
    assert [s.get("undone", False) for s in steps] == [False, True, False, True, False, True, False]
    assert [s["steering"]["value"] for s in kept] == pytest.approx([0.02, 0.01, 0.0])


def test_the_roll_back_stops_after_patience_unhelpful_trials_in_a_row():
    costs = {"n5": 0.01}
    selected, steps = roll_back(_qparams(), ["n0", "n1", "n2", "n3", "n4", "n5"], _check(costs, 0.005), max_ops=5,
                                fields=("error",), settled=lambda r, _looks: settled(r["verdict"], "fail"),
                                improves=improves, patience=3)
    assert len(steps) == 4 and all(s["undone"] for s in steps[1:]) and len(selected.ops) == 6


def _paired_check(limit: float = 0.005, width: float = 0.002):
    """n0 and n1 carry the error together (their errors cancel in part): n0 alone in float16 reads worse, n1
    alone a little better but not enough to count, both together clean."""
    table = {(False, False): 0.02, (True, False): 0.03, (False, True): 0.0199, (True, True): 0.0}

    def check(qp):
        int8 = {q.node for q in qp.ops}
        return _report(table[("n0" not in int8, "n1" not in int8)], limit, width)
    return check


def test_growing_keeps_layers_that_help_only_together_and_never_ships_ones_that_do_not():
    ranking = ["n0", "n1", "n2", "n3", "n4", "n5"]
    kw = dict(fields=("error",), settled=lambda r, _looks: settled(r["verdict"], "fail"), improves=improves)
    # one at a time: n0 worse, n1 and n2 no better, three misses end it with nothing in float16
    selected, steps = roll_back(_qparams(), ranking, _paired_check(), max_ops=5, **kw)
    assert len(selected.ops) == 6 and all(s.get("undone") and not s.get("grows") for s in steps[1:])
    # growing: n0 stays on trial, n0 + n1 together pass, and both are kept
    selected, steps = roll_back(_qparams(), ranking, _paired_check(), max_ops=5, grow=True, **kw)
    assert [[f["node"] for f in s["float_ops"]] for s in steps] == [[], ["n0"], ["n0", "n1"]]
    assert steps[1]["undone"] and steps[1]["grows"] and not steps[2].get("undone") and steps[2]["passed"]
    assert sorted(q.node for q in selected.ops) == ["n2", "n3", "n4", "n5"]
    # layers that never help, together or not, are not shipped; max_ops bounds the walk
    selected, steps = roll_back(_qparams(), ["n2", "n3", "n4", "n5"], _paired_check(), max_ops=3, grow=True, **kw)
    assert [len(s["float_ops"]) for s in steps] == [0, 1, 2, 3] and all(s["grows"] for s in steps[1:])
    assert len(selected.ops) == 6


def test_each_check_of_the_roll_back_is_counted_from_the_checks_made_before_it():
    """The recovery's two checks come first; the roll-back's step 0 takes the last of them, each trial one more."""
    seen = []

    def settle(report, looks):
        seen.append(looks)
        return False
    first = _check({}, 0.005)(_qparams())
    _, steps = roll_back(_qparams(), ["n0", "n1", "n2"], _check({"n0": 0.01, "n1": 0.01}, 0.005), max_ops=5,
                         fields=("error",), settled=settle, improves=improves, first=first, looks=2)
    assert seen == [2, 3, 4, 5] and [s["looks"] for s in steps] == [2, 3, 4, 5]
    seen.clear()
    roll_back(_qparams(), ["n0"], _check({"n0": 0.01}, 0.005), max_ops=5, fields=("error",), settled=settle,
              improves=improves)
    assert seen == [1, 2]


def test_the_margin_a_tuning_check_must_clear_grows_with_the_checks_already_made():
    """Stopping at the first of several checks to clear a fixed margin favours the check whose images' noise
    favoured INT8: the margin is Bonferroni's over the checks, so the gate's miss rate stays about one in six."""
    from statistics import NormalDist

    from quantflow.evaluation.intervals import MISS, expected_pass, margin

    assert margin(1) == pytest.approx(1.0) and MISS == pytest.approx(0.1587, abs=1e-4)
    assert all(margin(k) < margin(k + 1) for k in range(1, 10))
    assert 1.0 - NormalDist().cdf(margin(6)) == pytest.approx(MISS / 6)
    # the captcha reader's sixth check: CER 0.0148 on 664 tuning images, the gate's 4800: clears one deviation only
    cer = {"value": 0.0148, "low": 0.0105, "high": 0.0191, "limit": 0.02, "kind": "max", "gated": True}
    assert expected_pass([cer], 664, 4800, looks=1) and not expected_pass([cer], 664, 4800, looks=6)


def test_a_check_that_clears_only_the_first_checks_margin_does_not_stop_a_later_roll_back():
    """A figure that would settle at the first check does not at the sixth (tuning_settled's ``looks``)."""
    from tasks.fallback import tuning_settled

    figure = {"value": 0.0148, "low": 0.0105, "high": 0.0191, "limit": 0.02, "kind": "max", "gated": True}
    report = {"verdict": PASS, "passed": True, "figures": [figure], "images": 664}
    assert tuning_settled(report, "fail", 4800, looks=1) and not tuning_settled(report, "fail", 4800, looks=6)
    assert tuning_settled(report, "warn", 4800, looks=6)   # without on_undecided = "fail" the tuning verdict decides


def test_the_float16_floor_states_the_metric_figures_and_its_verdict():
    """Every gate records what the float16-only path (no op in INT8) does to the same images, so that INT8's
    damage can be told from what float16 alone changes (FP32's own near-ties)."""
    from pathlib import Path

    from quantflow.config import EvaluationSection
    from quantflow.evaluation.floor import floor_summary
    from quantflow.evaluation.metrics import metric

    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(4), 10)
    fp = rng.normal(size=(40, 4)) + 3 * np.eye(4)[labels]
    ref = judged(fp, fp + rng.normal(0, 1e-3, fp.shape), labels, EvaluationSection(data_dir=Path("e"), threshold=0.01))
    r = floor_summary(metric("top1"), ref)
    assert r["verdict"] == "PASS" and r["figure"].startswith("top-1 drop ") and r["drop"] == ref["drop"]
    assert [f["id"] for f in r["figures"]] == ["drop"] and r["changed"] == 0 and r["unit"] == "classes"


def test_a_tuning_figure_just_inside_its_limit_is_not_an_expected_pass_on_the_gates_images():
    from quantflow.evaluation.intervals import expected_pass

    near = {"value": 0.0138, "low": 0.0095, "high": 0.0189, "limit": 0.02, "kind": "max", "gated": True}
    far = dict(near, value=0.010, low=0.007, high=0.013)
    assert not expected_pass([near], 664, 1200) and expected_pass([far], 664, 1200)
    # the more images the gate judges, the less of its own interval the figure needs to clear
    edge = {"value": 0.95, "low": 0.93, "high": 0.97, "limit": 0.92, "kind": "min", "gated": True}
    assert expected_pass([edge], 200, 20000) and not expected_pass([edge], 200, 50)
    assert expected_pass([dict(near, gated=False)], 664, 1200)
    # the gate's own interval counts: 0.017 [.., 0.019] on 600 images and the gate's 600 others passes the gate
    # only where its value lands below 0.018, about three times in four: short of the five in six asked for
    close = {"value": 0.017, "low": 0.015, "high": 0.019, "limit": 0.02, "kind": "max", "gated": True}
    assert not expected_pass([close], 600, 600) and expected_pass([dict(close, value=0.0155, low=0.0135, high=0.0175)], 600, 600)


def test_each_costly_method_is_kept_or_undone_by_its_own_check_of_the_tuning_images():
    """ranges harms on the tuning images and is undone; adaround, run from the parameters before ranges, helps and is
    kept; a method that changes nothing costs no check.  No method is judged by the recovery images it fitted."""
    from tasks.recover import costly_checked

    rng = np.random.default_rng(5)
    labels = np.repeat(np.arange(3), 100)
    fp = rng.normal(size=(300, 3)) + 4 * np.eye(3)[labels]
    noise = rng.normal(0, 0.4, fp.shape)
    scale = {"start": 1.0, "ranges": 1.5, "adaround": 0.5}      # each "parameter set" is INT8 noise of this size
    runs = []

    def run(name, qp, record):    # the parameters after a method are named by it; "noop" changes nothing
        if name == "noop":
            return qp, record
        runs.append((name, qp))
        record["steps"].append({"method": name, "kept": True})
        return name, record
    check = lambda qp: _top1_check(fp, fp + scale[qp] * noise, labels)   # noqa: E731
    record = {"steps": [{"method": "equalize", "kept": True}]}
    first = check("start")
    qp, record, last, made = costly_checked("start", record, first, ("ranges", "noop", "adaround"), run, check,
                                            "fail")
    assert qp == "adaround" and made == 2 and runs == [("ranges", "start"), ("adaround", "start")]
    assert [(st["method"], st["kept"], st.get("undone_by")) for st in record["steps"]] == [
        ("equalize", True, None), ("ranges", False, "tuning check"), ("adaround", True, None)]
    assert record["steps"][1]["check"]["steering"]["value"] > first["steering"]["value"]
    assert last["steering"]["value"] == record["steps"][2]["check"]["steering"]["value"] < first["steering"]["value"]


def test_the_gate_points_out_tuning_images_on_which_int8_looked_far_better():
    """The MobileNetV3-small example tuned on its calibration (training) images: KL 0.0030 there, 0.0231 on the
    gate's held-out images with the same parameters."""
    from quantflow.tasks.gate import easier_tuning

    kl = lambda v: {"figure": "mean KL divergence (nats)", "value": v, "error": v}   # noqa: E731
    note = easier_tuning(kl(0.0030), kl(0.0231))
    assert note and "7.7x" in note and "tune_dir" in note and 'tune_from = "held_out"' in note
    assert easier_tuning(kl(0.010), kl(0.012)) is None            # the same images' sampling, not a bias
    assert easier_tuning(kl(0.0), kl(0.0)) is None and easier_tuning(None, kl(0.1)) is None
    sqnr = lambda db, part: {"figure": f"least SQNR dB ({part})", "value": db, "error": 10 ** (-db / 10)}  # noqa: E731
    assert easier_tuning(sqnr(36.9, "logits"), sqnr(30.0, "logits")) is not None
    assert easier_tuning(sqnr(36.9, "boxes"), sqnr(35.0, "scores")) is None
    assert easier_tuning(kl(0.003), sqnr(20.0, "scores")) is None   # not the same kind of figure


def test_the_costly_recovery_is_undone_where_the_tuning_images_say_it_harms():
    """Output-aware ranges and learned rounding are fitted to the recovery images; the check on the tuning images,
    which they did not learn from, undoes them where the parameters before them are better by the fallback's own
    rule, and keeps them where the difference is too small to tell."""
    from tasks.recover import costly_kept, undo

    rng = np.random.default_rng(3)
    labels = np.repeat(np.arange(3), 100)
    fp = rng.normal(size=(300, 3)) + 4 * np.eye(3)[labels]
    noise = rng.normal(0, 0.4, fp.shape)
    first = _top1_check(fp, fp + noise, labels)
    assert not costly_kept(first, _top1_check(fp, fp + 1.5 * noise, labels), "fail")   # worse on every image
    assert costly_kept(first, _top1_check(fp, fp + 0.5 * noise, labels), "fail")       # better on every image
    assert costly_kept(first, _top1_check(fp, fp + 1.01 * noise, labels), "fail")      # about the same
    record = {"steps": [{"method": "equalize", "kept": True}, {"method": "ranges", "kept": True},
                        {"method": "adaround", "kept": False}]}
    undo(record, 1)
    assert [s["kept"] for s in record["steps"]] == [True, False, False]
    assert record["steps"][1]["undone_by"] == "tuning check" and "undone_by" not in record["steps"][2]


def test_where_the_check_already_passes_a_costly_method_is_kept_only_where_it_brings_int8_nearer_fp32():
    """With the verdict the gate would pass on the tuning images, a costly method is there for the distance to the
    float16 floor: kept where the tuning images show INT8 nearer FP32 (the steering figure ``MIN_GAIN`` better),
    undone where they show it the same or worse (fitted to the recovery images, it may be nearer FP32 only there)."""
    from tasks.fallback import tuning_settled
    from tasks.recover import costly_kept

    rng = np.random.default_rng(3)
    labels = np.repeat(np.arange(3), 300)
    fp = rng.normal(size=(900, 3)) + 12 * np.eye(3)[labels]
    noise = rng.normal(0, 0.05, fp.shape)
    first = _top1_check(fp, fp + noise, labels)
    assert tuning_settled(first, "fail")
    assert costly_kept(first, _top1_check(fp, fp + 0.5 * noise, labels), "fail")        # better on every image
    assert not costly_kept(first, _top1_check(fp, fp + 1.01 * noise, labels), "fail")  # about the same
    assert not costly_kept(first, _top1_check(fp, fp + 1.5 * noise, labels), "fail")   # worse
    # better on the tuning images, but not nearer FP32 beyond their noise on the recovery images it learned from
    better = _top1_check(fp, fp + 0.5 * noise, labels)
    assert costly_kept(first, better, "fail", True) and costly_kept(first, better, "fail", None)
    assert not costly_kept(first, better, "fail", False)


def test_the_recovery_keeps_the_same_methods_whatever_price_a_release_sets():
    """With ``evaluation.max_vs_float16`` the checks carry the ratio's figure, which INT8 fails before the fallback
    buys it back; the recovery judges the metric's own figures, so a method about as good as the parameters
    before it is undone as in the build without the limit, not kept as where the task's own check fails."""
    from quantflow.evaluation.floor import VS_FLOAT16, unpriced
    from quantflow.evaluation.intervals import figure
    from quantflow.evaluation.verdicts import rejudge
    from tasks.recover import costly_checked

    rng = np.random.default_rng(3)
    labels = np.repeat(np.arange(3), 300)
    fp = rng.normal(size=(900, 3)) + 12 * np.eye(3)[labels]
    noise = rng.normal(0, 0.05, fp.shape)
    scale = {"start": 1.0, "ranges": 1.01}

    def priced(qp):   # the check with the release's price figure, which fails (13 changes where float16 makes 1)
        r = _top1_check(fp, fp + scale[qp] * noise, labels)
        r["figures"] = r["figures"] + [figure(VS_FLOAT16, VS_FLOAT16, "ratio", 13.0, 2.0, "max", [12.0, 13.0, 14.0],
                                              900, 0.95)]
        return rejudge(r)

    def run(name, qp, record):
        record["steps"].append({"method": name, "kept": True})
        return name, record

    first = priced("start")
    assert first["verdict"] == FAIL and unpriced(first)["verdict"] == PASS
    for check in (priced, lambda qp: unpriced(priced(qp))):
        record = {"steps": []}
        qp, record, _, made = costly_checked("start", record, check("start"), ("ranges",), run, check, "fail")
        assert qp == "start" and made == 1 and record["steps"][0]["undone_by"] == "tuning check"


def test_a_costly_method_the_recovery_images_call_worse_is_undone_where_the_check_passes():
    """adaround would help on the tuning images, but on the recovery images it raises some images' SQNR and lowers
    others' by as much (their pooled least SQNR, which does not judge it, rises): not nearer beyond their noise, so
    with a passing first check it is undone, by the recovery images, without a check of the tuning images;
    the parameters before stay.  Where the first check fails, the same step is checked and kept (it helps there)."""
    from quantflow.quantization.recovery.measure import GUARD, PER_IMAGE
    from tasks.recover import costly_checked

    rng = np.random.default_rng(5)
    labels = np.repeat(np.arange(3), 100)
    fp = rng.normal(size=(300, 3)) + 12 * np.eye(3)[labels]
    noise = rng.normal(0, 0.4, fp.shape)
    scale = {"start": 1.0, "adaround": 0.5}

    after = {GUARD: 26.0, PER_IMAGE: {"out": [26.0, 24.0] * 16}}   # +1 dB on half the images, -1 on the rest

    def run(name, qp, record):
        record["steps"].append({"method": name, "kept": True, "after": after})
        return name, record

    def start():
        return {"before": {GUARD: 25.0, PER_IMAGE: {"out": [24.5] * 32}},
                "steps": [{"method": "equalize", "kept": True,
                           "after": {GUARD: 25.5, PER_IMAGE: {"out": [25.0] * 32}}}]}
    check = lambda qp: _top1_check(fp, fp + scale[qp] * noise, labels)   # noqa: E731
    record = start()
    first = check("start")
    assert first["passed"]
    qp, record, last, made = costly_checked("start", record, first, ("adaround",), run, check, "fail")
    assert qp == "start" and made == 0 and last is first and "check" not in record["steps"][1]
    assert record["steps"][1]["kept"] is False and record["steps"][1]["undone_by"] == "recovery images"
    scale["start"] = 12.0    # INT8 noise the gate fails on
    failing = check("start")
    assert not failing["passed"]
    record = start()
    qp, record, last, made = costly_checked("start", record, failing, ("adaround",), run, check, "fail")
    assert qp == "adaround" and made == 1 and record["steps"][1]["kept"] and last["passed"]
    # nearer on every recovery image (+1 dB each): checked on the tuning images, and kept where they pass
    after[PER_IMAGE] = {"out": [26.0] * 32}
    qp, record, last, made = costly_checked("start", start(), first, ("adaround",), run, check, "fail")
    assert qp == "adaround" and made == 1 and record["steps"][1]["kept"]
    assert record["steps"][1]["recovery_images"] == {"region": "out", "change": 1.0, "se": 0.0, "nearer": True}
    # the first method to change anything is judged against the measurement made just before it
    after[PER_IMAGE] = {"out": [26.0, 24.0] * 16}

    def first_run(name, qp, record):
        record["before"] = {GUARD: 25.0, PER_IMAGE: {"out": [25.0] * 32}}
        return run(name, qp, record)
    qp, record, _, made = costly_checked("start", {"steps": []}, first, ("ranges",), first_run, check, "fail")
    assert qp == "start" and made == 0 and record["steps"][0]["undone_by"] == "recovery images"
