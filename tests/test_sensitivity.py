"""Per-layer sensitivity analysis, bias correction and the automatic float16 fallback."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from support import nets

from quantflow.engine.int8_emulator import Emulator
from quantflow.engine.runner import float_runner
from quantflow.evaluation.top1 import compare
from quantflow.frontends.mindir import read_mindir
from quantflow.quantization.calibrater import calibrate
from quantflow.quantization.deploy import quantized_graph
from quantflow.quantization.fallback import roll_back, without
from quantflow.quantization.passes import fold_for_quantization
from quantflow.quantization.qparams import QuantizedOp, QuantParams
from quantflow.quantization.sensitivity import (
    Agreement,
    Sensitivity,
    _ChannelShift,
    _from_its_quant,
    analyse,
    correct_bias,
    rank,
)


def sqnr_db(r, q):
    r, q = np.asarray(r, np.float64).ravel(), np.asarray(q, np.float64).ravel()
    return 10.0 * np.log10(np.sum(r ** 2) / np.sum((r - q) ** 2))


def cosine(r, q):
    r, q = np.asarray(r, np.float64).ravel(), np.asarray(q, np.float64).ravel()
    return float(np.dot(r, q) / (np.linalg.norm(r) * np.linalg.norm(q)))


# ------------------------------------------------------------------------------------------------ Agreement
def test_agreement_matches_numpy_over_several_batches():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(5, 3, 7, 7))
    q = r + rng.normal(scale=0.05, size=r.shape)
    a = Agreement()
    for i in range(len(r)):          # running sums: batch by batch equals all at once
        a.add(r[i], q[i])
    assert a.sqnr_db == pytest.approx(sqnr_db(r, q), rel=1e-9)
    assert a.cosine == pytest.approx(cosine(r, q), rel=1e-12)
    assert a.sqnr_db == pytest.approx(10 * np.log10(1 / 0.05 ** 2), abs=0.2)   # unit signal, 0.05 noise: ~26 dB
    assert a.as_dict() == {"sqnr_db": a.sqnr_db, "cosine": a.cosine}


def test_agreement_of_float16_inputs_is_computed_in_float64():
    rng = np.random.default_rng(1)
    r = rng.normal(size=4000).astype(np.float32)
    q = r.astype(np.float16)
    a = Agreement()
    a.add(r, q)
    assert a.sqnr_db == pytest.approx(sqnr_db(r, q.astype(np.float64)), rel=1e-9)
    assert 60 < a.sqnr_db < 80          # float16 rounding: ~ 11 significant bits


def test_agreement_of_identical_outputs_is_infinite_sqnr_and_cosine_one():
    r = np.random.default_rng(2).normal(size=(3, 10))
    a = Agreement()
    a.add(r, r.copy())
    assert a.sqnr_db == float("inf") and a.cosine == pytest.approx(1.0, abs=1e-15)
    z = Agreement()
    z.add(np.zeros(8), np.zeros(8))     # all-zero, and exactly so
    assert z.sqnr_db == float("inf") and z.cosine == 1.0


def test_agreement_scale_sign_and_degenerate_cases():
    r = np.random.default_rng(3).normal(size=1000)
    doubled, flipped, zero_q, zero_r = Agreement(), Agreement(), Agreement(), Agreement()
    doubled.add(r, 2 * r)   # error energy equals signal energy: 0 dB, yet the same direction
    flipped.add(r, -r)      # error = 2r: -6 dB, opposite direction
    zero_q.add(r, np.zeros_like(r))
    zero_r.add(np.zeros_like(r), r)
    assert doubled.sqnr_db == pytest.approx(0.0, abs=1e-12) and doubled.cosine == pytest.approx(1.0)
    assert flipped.sqnr_db == pytest.approx(-10 * np.log10(4)) and flipped.cosine == pytest.approx(-1.0)
    assert zero_q.sqnr_db == pytest.approx(0.0, abs=1e-12) and zero_q.cosine == 0.0
    assert zero_r.cosine == 0.0 and zero_r.sqnr_db < -200   # no signal at all: as bad as it gets, finite


# ------------------------------------------------------------------------------------------------ analyse
@pytest.fixture(scope="module")
def residual(tmp_path_factory):
    path = nets.export(nets.ResidualNet(), tmp_path_factory.mktemp("sens") / "res.mindir")
    folded = fold_for_quantization(read_mindir(path))
    rng = np.random.default_rng(1)
    calib = rng.normal(size=(32, 3, 16, 16)).astype(np.float32)
    batches = [calib[:16], calib[16:]]
    qp = calibrate(folded, batches, "minmax", rollback_small_channels=False)
    return folded, qp, batches


@pytest.fixture(scope="module")
def analysed(residual):
    folded, qp, batches = residual
    return analyse(folded, qp, batches, bias_shift=True)


def break_op(qp: QuantParams, i: int) -> QuantParams:
    """``qp`` with op ``i``'s weights reduced to their signs (as tests/test_gate.py does)."""
    broken = copy.deepcopy(qp)
    broken.ops[i].weight = (np.sign(broken.ops[i].weight) * 127).astype(np.int8)
    return broken


def test_one_row_per_quantized_op_in_graph_order(residual, analysed):
    folded, qp, batches = residual
    assert isinstance(analysed, Sensitivity)
    assert [r["node"] for r in analysed.rows] == [q.node for q in qp.ops]
    assert [(r["scope"], r["op"], r["method"]) for r in analysed.rows] == [(q.scope, q.op, "minmax") for q in qp.ops]
    assert analysed.images == sum(len(b) for b in batches) == 32
    for r in analysed.rows:
        for key in ("alone", "output", "cumulative"):
            assert set(r[key]) == {"sqnr_db", "cosine"}
            # a working minmax quantization of a small net: close to FP32 but not exact
            assert 20 < r[key]["sqnr_db"] < 100 and 0.99 < r[key]["cosine"] < 1.0


def test_ranking_is_a_permutation_sorted_by_output_sqnr(analysed):
    ranking = analysed.ranking
    nodes = [r["node"] for r in analysed.rows]
    assert sorted(ranking) == sorted(nodes) and len(set(ranking)) == len(nodes)
    out = [analysed.row(n)["output"]["sqnr_db"] for n in ranking]
    assert out == sorted(out)
    d = analysed.as_dict()
    assert d["ranking"] == ranking and d["ops"] == analysed.rows and d["images"] == 32
    table = analysed.table(top=2).splitlines()
    assert len(table) == 3 and analysed.row(ranking[0])["scope"][-48:] in table[1]


def test_rows_agree_with_direct_runs(residual, analysed):
    folded, qp, batches = residual
    final = folded.outputs[0]
    x = np.concatenate(batches)
    ref = float_runner(folded).run(x)[final]
    # the dense layer's row: the network output with only it in INT8, checked with NumPy
    fc = qp.ops[-1]
    assert fc.op == "MatMul"
    got = Emulator(quantized_graph(folded, QuantParams(qp.method, [fc]))).logits(x.astype(np.float16))
    row = analysed.row(fc.node)
    assert row["output"]["sqnr_db"] == pytest.approx(sqnr_db(ref, got), rel=1e-6)
    # products in float32 (sums in float64): agreement to 1e-7, where the report shows 5 decimals
    assert row["output"]["cosine"] == pytest.approx(cosine(ref, got), rel=1e-7)
    # its own output is the network output, so "alone" is "output"
    assert row["alone"] == row["output"]
    # the first op reads the network input: with every op in INT8 its output is the same as alone
    first = analysed.rows[0]
    assert first["cumulative"]["sqnr_db"] == pytest.approx(first["alone"]["sqnr_db"], rel=1e-9)
    # every op in INT8 at once: the dense layer's cumulative error is that of the whole INT8 network
    every = Emulator(quantized_graph(folded, qp)).logits(x.astype(np.float16))
    assert row["cumulative"]["sqnr_db"] == pytest.approx(sqnr_db(ref, every), rel=1e-6)


def test_parts_of_an_output_are_measured_on_their_own(residual, analysed):
    """evaluation.parts: a part's figures are those of its slice of the output (a detector's class scores apart
    from its boxes); a part spanning the whole axis has the output's own figures, and the rows stay as they are."""
    from quantflow.evaluation.parts import Region

    folded, qp, batches = residual
    final = folded.outputs[0]
    shape = tuple(folded.shape(final))
    parts = {"head": (final, Region("head", "out", (shape[0], 4), 1, 0, 4, "head")),
             "all": (final, Region("all", "out", shape, 1, 0, shape[1], "all"))}
    measured = analyse(folded, qp, batches, bias_shift=True, parts=parts)
    x = np.concatenate(batches)
    ref = float_runner(folded).run(x)[final]
    fc = qp.ops[-1]
    got = Emulator(quantized_graph(folded, QuantParams(qp.method, [fc]))).logits(x.astype(np.float16))
    row = measured.row(fc.node)
    assert row["per_part"]["head"]["sqnr_db"] == pytest.approx(sqnr_db(ref[:, :4], got[:, :4]), rel=1e-6)
    assert row["per_part"]["head"]["sqnr_db"] != pytest.approx(row["output"]["sqnr_db"], rel=1e-3)
    for r in measured.rows:
        assert r["per_part"]["all"] == pytest.approx(r["output"], rel=1e-9)
        assert {k: v for k, v in r.items() if k != "per_part"} == analysed.row(r["node"])
    # ranked on a part: by its figures
    by_head = rank(measured.rows, parts=["head"])
    assert [measured.row(n)["per_part"]["head"]["sqnr_db"] for n in by_head] == sorted(
        r["per_part"]["head"]["sqnr_db"] for r in measured.rows)


def test_each_row_is_what_emulating_the_whole_graph_with_that_op_alone_gives(residual, analysed):
    """The sweep emulates only the graph from each op's Quant on, fed with the float16 emulation's values:
    every number equals the one from emulating the whole graph with that op alone in INT8 (the sweep as it
    was, kept here as the reference)."""
    folded, qp, batches = residual
    out_of = {n.name: n.outputs[0] for n in folded.nodes}
    final = folded.outputs[0]
    fp32 = float_runner(folded, [out_of[q.node] for q in qp.ops])
    assert any(len(_from_its_quant(folded, qp, q.node).nodes) < len(quantized_graph(folded, QuantParams(
        qp.method, [q])).nodes) for q in qp.ops)   # some runs are suffixes indeed
    for q in qp.ops:
        t = out_of[q.node]
        emu = Emulator(quantized_graph(folded, QuantParams(qp.method, [q])), extra_outputs=[t])
        alone, output, shift = Agreement(), Agreement(), _ChannelShift(q.relu)
        for x in batches:
            ref, got = fp32.run(x, [t, final]), emu.outputs(x.astype(np.float16), [t, final])
            r = np.maximum(ref[t], 0) if q.relu and t != final else ref[t]
            alone.add(r, got[t])
            output.add(ref[final], got[final])
            shift.add(r, got[t])
        row = analysed.row(q.node)
        assert row["alone"] == alone.as_dict() and row["output"] == output.as_dict(), q.node
        assert np.array_equal(analysed.bias_shift[q.node], shift.mean()), q.node


def test_dense_layers_over_positions_run_the_whole_graph(tmp_path):
    """A Dense over (images x positions, channels), as in ConvNeXt and ViT, cannot be fed from a cut in batches
    of images: its run emulates the whole graph, and every row is still that of the op alone in INT8."""
    folded = fold_for_quantization(read_mindir(nets.export(nets.TokenMLP(), tmp_path / "tok.mindir", shape=(1, 3, 16, 16))))
    x = np.random.default_rng(2).normal(size=(6, 3, 16, 16)).astype(np.float32)
    qp = calibrate(folded, [x], "minmax", rollback_small_channels=False)
    dense = [q for q in qp.ops if q.op == "MatMul" and folded.shape(q.input)[0] != 1]
    assert len(dense) == 2 and all(_from_its_quant(folded, qp, q.node).inputs == folded.inputs for q in dense)
    sens = analyse(folded, qp, [x[:3], x[3:]])
    final = folded.outputs[0]
    ref = float_runner(folded).run(x)[final]
    for q in qp.ops:
        got = Emulator(quantized_graph(folded, QuantParams(qp.method, [q]))).logits(x.astype(np.float16))
        output = Agreement()
        for part in (slice(0, 3), slice(3, 6)):
            output.add(ref[part], got[part])
        assert sens.row(q.node)["output"] == output.as_dict(), q.scope


@pytest.mark.parametrize("broken_op", [0, 1, 2, 3])
def test_a_broken_op_ranks_first(residual, analysed, broken_op):
    folded, qp, batches = residual
    broken = break_op(qp, broken_op)
    s = analyse(folded, broken, batches)
    node = qp.ops[broken_op].node
    assert s.ranking[0] == node
    assert s.row(node)["output"]["sqnr_db"] < analysed.row(node)["output"]["sqnr_db"] - 20
    # the other ops' own rows do not change (each runs alone in INT8)
    for r in s.rows:
        if r["node"] != node:
            assert r["output"] == analysed.row(r["node"])["output"] and r["alone"] == analysed.row(r["node"])["alone"]


def test_bias_shift_is_one_value_per_output_channel(residual, analysed):
    _, qp, _ = residual
    assert set(analysed.bias_shift) == {q.node for q in qp.ops}
    for q in qp.ops:
        shift = analysed.bias_shift[q.node]
        assert shift.shape == (q.weight.shape[q.channel_axis],) == (len(q.scale_w),)
        assert np.all(np.isfinite(shift)) and np.any(shift != 0)
    assert analyse(residual[0], qp, residual[2]).bias_shift == {}   # only measured when asked


def test_correct_bias_moves_int32_biases_by_the_rounded_shift(residual):
    _, qp, _ = residual
    a, b = qp.ops[0], qp.ops[2]
    rng = np.random.default_rng(5)
    steps = a.scale_d * np.asarray(a.scale_w, np.float64)
    shift = (rng.integers(-50, 50, len(steps)) + rng.uniform(-0.4, 0.4, len(steps))) * steps
    shift[0] = 0.0
    shifts = {a.node: shift, b.node: np.zeros(len(b.scale_w))}
    out = correct_bias(qp, shifts)
    expected = np.array([int(x) + round(s / st) for x, s, st in zip(a.bias, shift, steps)])
    got = out.by_node()[a.node]
    np.testing.assert_array_equal(got.bias, expected)
    assert got.bias.dtype == np.int32 and got.stats.get("bias_corrected") is True
    np.testing.assert_array_equal(out.by_node()[b.node].bias, b.bias)   # a zero shift moves nothing
    # ops without a shift are untouched, weights and scales everywhere unchanged
    for q0, q1 in zip(qp.ops, out.ops):
        if q0.node not in shifts:
            np.testing.assert_array_equal(q1.bias, q0.bias)
            assert "bias_corrected" not in q1.stats
        np.testing.assert_array_equal(q1.weight, q0.weight)
        assert q1.scale_d == q0.scale_d and np.array_equal(q1.deq_scale, q0.deq_scale)
    # the input is not modified
    assert "bias_corrected" not in a.stats and not np.array_equal(a.bias, got.bias)


def test_correct_bias_saturates_at_the_int32_limits(residual):
    _, qp, _ = residual
    a = qp.ops[1]
    steps = a.scale_d * np.asarray(a.scale_w, np.float64)
    shift = np.zeros(len(steps))
    shift[0], shift[1] = 1e12 * steps[0], -1e12 * steps[1]   # beyond int32, within int64 accumulator units
    got = correct_bias(qp, {a.node: shift}).by_node()[a.node].bias
    info = np.iinfo(np.int32)
    assert got[0] == info.max and got[1] == info.min and got.dtype == np.int32
    np.testing.assert_array_equal(got[2:], a.bias[2:])


def test_correct_bias_saturates_in_the_right_direction_beyond_int64(residual):
    _, qp, _ = residual
    a = qp.ops[1]
    shift = np.zeros(len(a.scale_w))
    shift[0], shift[1] = 1e30, -1e30
    got = correct_bias(qp, {a.node: shift}).by_node()[a.node].bias
    info = np.iinfo(np.int32)
    assert got[0] == info.max and got[1] == info.min


def test_measured_bias_correction_removes_the_mean_shift(residual, analysed):
    folded, qp, batches = residual
    corrected = correct_bias(qp, analysed.bias_shift)
    after = analyse(folded, corrected, batches, bias_shift=True)
    for q in qp.ops:
        before_shift = np.abs(analysed.bias_shift[q.node]).mean()
        assert np.abs(after.bias_shift[q.node]).mean() < 0.25 * before_shift
        assert after.row(q.node)["alone"]["sqnr_db"] >= analysed.row(q.node)["alone"]["sqnr_db"] - 0.05


# ------------------------------------------------------------------------------------------------ fallback
def fake_qparams(n=5) -> QuantParams:
    ops = [QuantizedOp(node=f"n{i}", scope=f"Default/layer{i}/Conv2D-op{i}", op="Conv2D", input=f"t{i}",
                       scale_d=0.1, offset_d=0, scale_w=np.ones(2), channel_axis=0,
                       weight=np.ones((2, 1, 1, 1), np.int8), bias=np.zeros(2, np.int32),
                       deq_scale=np.full(2, 0.1, np.float32)) for i in range(n)]
    return QuantParams("kl", ops)


class FakeCheck:
    """Passes once every op of ``culprits`` is out of the INT8 set; top-1 rises by 0.1 per culprit removed."""

    def __init__(self, culprits, fp32=0.9):
        self.culprits, self.fp32, self.seen = set(culprits), fp32, []

    def __call__(self, qp: QuantParams) -> dict:
        int8 = {q.node for q in qp.ops}
        self.seen.append(sorted(int8))
        left = len(self.culprits & int8)
        top1 = self.fp32 - 0.1 * left
        return {"passed": left == 0, "int8_top1": top1, "drop": self.fp32 - top1}


def test_without_leaves_the_named_ops_in_float():
    qp = fake_qparams()
    out = without(qp, ["n1", "n3", "absent"])
    assert [q.node for q in out.ops] == ["n0", "n2", "n4"] and out.method == "kl"
    assert [q.node for q in qp.ops] == ["n0", "n1", "n2", "n3", "n4"]   # the input is not modified
    assert [q.node for q in without(qp, []).ops] == [q.node for q in qp.ops]
    assert without(qp, (q.node for q in qp.ops)).ops == []


def test_roll_back_follows_the_ranking_and_stops_when_the_check_passes():
    qp = fake_qparams()
    ranking = ["n3", "n0", "n4", "n1", "n2"]
    check = FakeCheck({"n3", "n0", "n4"})
    selected, steps = roll_back(qp, ranking, check, max_ops=5)
    assert [q.node for q in selected.ops] == ["n1", "n2"]
    assert len(steps) == 4 and len(check.seen) == 4
    # every step: the ops in float so far (in ranking order, with their scopes), the INT8 count, the check's result
    for k, s in enumerate(steps):
        assert [f["node"] for f in s["float_ops"]] == ranking[:k]
        assert [f["scope"] for f in s["float_ops"]] == [f"Default/layer{n[1]}/Conv2D-op{n[1]}" for n in ranking[:k]]
        assert s["int8_ops"] == 5 - k == len(check.seen[k])
        assert s["int8_top1"] == pytest.approx(0.9 - 0.1 * (3 - k))
        assert s["drop"] == pytest.approx(0.1 * (3 - k))
        assert s["passed"] is (k == 3) and s["looks"] == k + 1   # the checks made so far, this one among them
        assert set(s) == {"float_ops", "int8_ops", "int8_top1", "drop", "passed", "looks"}


def test_roll_back_takes_a_check_already_made_as_its_first_step():
    qp = fake_qparams()
    ranking = ["n3", "n0", "n4", "n1", "n2"]
    made = FakeCheck({"n3", "n0"})(qp)          # the recovery's check of the same parameters
    check = FakeCheck({"n3", "n0"})
    selected, steps = roll_back(qp, ranking, check, max_ops=5, first=made)
    # the same steps as checking again, one check fewer: step 0 is the one given
    again, again_steps = roll_back(qp, ranking, FakeCheck({"n3", "n0"}), max_ops=5)
    assert steps == again_steps and selected.ops == again.ops
    assert len(check.seen) == len(steps) - 1 and all(len(s) < 5 for s in check.seen)
    # a passing check given: no check at all
    passing = FakeCheck(set())
    _, one = roll_back(qp, ranking, passing, max_ops=5, first=passing(qp))
    assert len(one) == 1 and one[0]["passed"] and len(passing.seen) == 1


def test_roll_back_of_a_passing_quantization_is_one_step():
    qp = fake_qparams()
    selected, steps = roll_back(qp, ["n0", "n1"], FakeCheck(set()), max_ops=3)
    assert [q.node for q in selected.ops] == [q.node for q in qp.ops]
    assert steps == [{"float_ops": [], "int8_ops": 5, "int8_top1": 0.9, "drop": 0.0, "passed": True, "looks": 1}]


def test_roll_back_stops_at_max_ops():
    qp = fake_qparams()
    ranking = ["n4", "n3", "n2", "n1", "n0"]
    check = FakeCheck({"n4", "n0"})        # n0 is last in the ranking: it would take every op
    selected, steps = roll_back(qp, ranking, check, max_ops=2)
    assert len(steps) == 3 and not any(s["passed"] for s in steps)
    assert [f["node"] for f in steps[-1]["float_ops"]] == ["n4", "n3"]
    assert [q.node for q in selected.ops] == ["n0", "n1", "n2"]   # the last step's parameters
    _, none = roll_back(qp, ranking, FakeCheck({"n4"}), max_ops=0)
    assert len(none) == 1 and none[0]["float_ops"] == [] and none[0]["passed"] is False


def test_roll_back_with_max_ops_beyond_the_ops_stops_when_all_are_float():
    qp = fake_qparams(3)

    def check(q):                           # never passes
        return {"passed": False, "int8_top1": 0.1, "drop": 0.8}

    selected, steps = roll_back(qp, ["n2", "n1", "n0"], check, max_ops=50)
    assert len(steps) == 4 and [s["int8_ops"] for s in steps] == [3, 2, 1, 0]
    assert selected.ops == [] and not steps[-1]["passed"]


def test_roll_back_ignores_ranked_nodes_that_are_not_quantized():
    qp = fake_qparams(3)
    selected, steps = roll_back(qp, ["skipped", "n1", "gone", "n0", "n2"], FakeCheck({"n1", "n0"}), max_ops=10)
    assert [[f["node"] for f in s["float_ops"]] for s in steps] == [[], ["n1"], ["n1", "n0"]]
    assert [q.node for q in selected.ops] == ["n2"] and steps[-1]["passed"]


def _row(node, pooled, **each):
    row = {"node": node, "output": {"sqnr_db": pooled, "cosine": 0.9}}
    if each:
        row["per_output"] = {k: {"sqnr_db": v, "cosine": 0.9} for k, v in each.items()}
    return row


def test_rank_orders_by_pooled_sqnr_or_by_the_least_sqnr_on_the_named_outputs():
    rows = [_row("a", 30.0, coarse=40.0, fine=25.0), _row("b", 20.0, coarse=18.0, fine=35.0),
            _row("c", 25.0, coarse=22.0, fine=20.0), _row("d", 25.0, coarse=50.0, fine=50.0)]
    assert rank(rows) == ["b", "c", "d", "a"]                       # pooled; the tie c/d by name
    assert rank(rows, ["fine"]) == ["c", "a", "b", "d"]
    assert rank(rows, ["coarse"]) == ["b", "c", "a", "d"]
    assert rank(rows, ["coarse", "fine"]) == ["b", "c", "a", "d"]   # each op's worst of the two: 18, 20, 25, 50
    assert rank(rows, []) == rank(rows, None) == rank(rows)
    # rows without per-output figures (a single-output network, an older analysis) keep the pooled key
    assert rank([_row("x", 10.0), _row("y", 5.0)], ["fine"]) == ["y", "x"]


def test_roll_back_takes_each_next_op_from_the_ranking_of_what_failed():
    qp = fake_qparams(4)
    ranking = ["n0", "n1", "n2", "n3"]
    seen = []

    def check(q):                  # passes once n3 and n2 are in float; reports which of them is left
        left = sorted({"n3", "n2"} & {o.node for o in q.ops})
        return {"passed": not left, "int8_top1": 0.5, "drop": 0.1 * len(left), "failing": left}

    def rerank(result):            # the ops that harm what failed most first
        seen.append(result["failing"])
        return result["failing"] + [n for n in ranking if n not in result["failing"]]

    selected, steps = roll_back(qp, ranking, check, max_ops=4, rerank=rerank)
    assert [[f["node"] for f in s["float_ops"]] for s in steps] == [[], ["n2"], ["n2", "n3"]]
    assert seen == [["n2", "n3"], ["n3"]] and steps[-1]["passed"]
    assert [q.node for q in selected.ops] == ["n0", "n1"]
    # without rerank the same check takes the static ranking: every op until n2 and n3 are gone
    _, plain = roll_back(qp, ranking, check, max_ops=4)
    assert [f["node"] for f in plain[-1]["float_ops"]] == ["n0", "n1", "n2", "n3"]


def test_sensitivity_ranking_drives_the_fallback_to_the_broken_layer(residual, analysed):
    folded, qp, batches = residual
    # the depthwise convolution, the least sensitive op of the clean quantization, broken
    dw = qp.ops[1]
    assert analysed.ranking[-1] == dw.node
    broken = break_op(qp, 1)
    ranking = analyse(folded, broken, batches).ranking
    x = np.concatenate(batches)
    fp = float_runner(folded).run(x)[folded.outputs[0]].astype(np.float64)
    labels = fp.argmax(1)   # FP32's own predictions as labels

    def check(q):           # the accuracy figures of the gate; passes at 30 dB output SQNR
        got = Emulator(quantized_graph(folded, q)).logits(x.astype(np.float16)).astype(np.float64)
        r = compare(fp, got, labels, threshold=0.02)
        return {**r, "passed": sqnr_db(fp, got) >= 30.0}

    assert not check(broken)["passed"] and check(qp)["passed"]
    selected, steps = roll_back(broken, ranking, check, max_ops=3)
    assert len(steps) == 2 and [f["node"] for f in steps[-1]["float_ops"]] == [dw.node]
    assert steps[-1]["passed"] and not steps[0]["passed"]
    assert steps[-1]["float_ops"][0]["scope"] == dw.scope
    assert [q.node for q in selected.ops] == [q.node for q in qp.ops if q.node != dw.node]
