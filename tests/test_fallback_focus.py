"""Issue 36 part 2: a failing task metric ranks layers by what it depends on.  A detector whose appended identity
1x1 conv loses the class scores in INT8 while the whole output, whose energy is the boxes', barely moves
(support/head_onnx.py): the failing detection gate ranks that conv first -- by the part that loses most, not by the
whole output, where the box head's conv comes first -- in the message, the report and the fallback's order alike;
the fallback rolls it back first, and a layer whose roll-back does not help is not shipped in float16."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.head_onnx import BOX, IDENTITY, head_detector
from support.project import REPO, run_quantflow

from quantflow.config import OutputPart
from quantflow.evaluation.metrics import metric
from quantflow.evaluation.parts import regions
from quantflow.frontends.onnx_model import read_onnx
from quantflow.quantization.calibrater import calibrate
from quantflow.quantization.passes import fold_for_quantization
from quantflow.quantization.sensitivity import analyse, figure, focus_label, rank
from tasks.fallback import focus, ranked

PARTS = {"boxes": OutputPart(axis=1, slice="0:4", gate=False), "scores": OutputPart(axis=1, slice="4:", gate=False)}


@pytest.fixture(scope="module")
def analysed():
    graph = fold_for_quantization(read_onnx(head_detector()))
    x = np.random.default_rng(0).uniform(0, 1, (16, 3, 32, 32)).astype(np.float32)
    qp = calibrate(graph, [x], "minmax")
    out = graph.outputs[0]
    found = regions(PARTS, [("output0", tuple(graph.shape(out)))], None)
    parts = {r.part: (out, r) for r in found if r.part}
    s = analyse(graph, qp, [x[:8], x[8:]], parts=parts)
    names = {out: "output0"}
    rows = [{"output": r.output, "part": r.part} for r in found]
    scope = {r["node"]: r["scope"] for r in s.rows}
    return s.as_dict(), names, rows, scope


def test_a_failing_task_number_ranks_layers_by_the_part_that_loses_most(analysed):
    sensitivity, names, rows, scope = analysed
    report = {"failures": ["f1"], "outputs": rows}
    # the whole output ranks the box head's conv first; the appended conv loses the scores (about 0 dB)
    assert scope[sensitivity["ranking"][0]] == BOX
    assert [scope[n] for n in rank(sensitivity["ops"], None, ["scores"])][0] == IDENTITY
    assert focus(sensitivity, metric("detection"), names, report) == ([], ["boxes", "scores"])
    focused = ranked(sensitivity, metric("detection"), names, report)
    assert scope[focused["ranking"][0]] == IDENTITY and focus_label(focused) == "worst of part boxes / part scores"
    rows_by = {r["node"]: r for r in sensitivity["ops"]}
    least = [min(r["per_part"]["boxes"]["sqnr_db"], r["per_part"]["scores"]["sqnr_db"]) for r in sensitivity["ops"]]
    assert [figure(rows_by[n], [], ["boxes", "scores"]) for n in focused["ranking"]] == sorted(least)
    assert figure(rows_by[focused["ranking"][0]], [], ["boxes", "scores"]) < 5 < rows_by[focused["ranking"][0]][
        "output"]["sqnr_db"] - 40


def test_one_output_not_cut_into_parts_is_ranked_by_the_pooled_figure(analysed):
    sensitivity, names, rows, _ = analysed
    whole = [r for r in rows if not r["part"]]
    assert focus(sensitivity, metric("detection"), names, {"failures": ["f1"], "outputs": whole}) == (None, None)
    assert focus(sensitivity, metric("top1"), names, {"failures": ["drop"]}) == (None, None)
    # a failing part: that part alone
    assert focus(sensitivity, metric("outputs"), names, {"failures": ["scores"], "outputs": rows}) == ([], ["scores"])
    # a row without per-output figures is of a one-output network: its output's figure is the pooled one
    row = sensitivity["ops"][0]
    assert figure(row, ["v_out"], ["scores"]) == min(row["output"]["sqnr_db"], row["per_part"]["scores"]["sqnr_db"])


@pytest.mark.slow
def test_the_failing_gate_names_and_the_fallback_rolls_back_the_collapsing_layer_first(tmp_path):
    from support.head_onnx import project

    folder = project(tmp_path / "repo", REPO)
    text = (folder / "quantflow.toml").read_text()
    (folder / "off.toml").write_text(text)
    proc = run_quantflow(folder, "build", "off.toml")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "task metric detection on INT8 against FP32: f1 " in out
    named = out[out.index("Most sensitive layers for worst of part boxes / part scores: "):].split(": ", 1)[1]
    assert named.startswith(f"{IDENTITY} (worst of part boxes / part scores SQNR ")
    html = next((folder / "build" / "artifacts" / "gate").glob("*/report.html")).read_text()
    assert "<th>worst of part boxes / part scores SQNR dB</th>" in html

    (folder / "auto.toml").write_text(text + 'fallback = "auto"\nmax_fallback = 3\n')
    proc = run_quantflow(folder, "build", "auto.toml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    latest = json.loads((folder / "build" / "latest.json").read_text())
    fallback = json.loads((Path(latest["artifacts"]["fallback"]) / "fallback.json").read_text())
    steps = fallback["steps"]
    assert [f["scope"] for f in steps[1]["float_ops"]] == [IDENTITY]
    assert latest["float16_fallback"] == [IDENTITY] and BOX not in latest["float16_fallback"]
    # every layer shipped in float16 was kept by a step that helped; a step that did not is marked undone
    kept = [s for s in steps[1:] if not s.get("undone")]
    assert [f["scope"] for f in kept[-1]["float_ops"]] == latest["float16_fallback"]
