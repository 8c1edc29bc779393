"""A YOLO-style detector (tests/nets.py DetectorStyle: SiLU backbone, nearest upsampling, concatenation,
two Sigmoid heads) through the graph stages, every output checked: the IR against MindSpore, the INT8
emulation against FP32, the deploy ONNX graph and the deploy MindIR read back against the emulation; a
detector project built with ``quantflow build`` and gated on every output (``evaluation.metric = "outputs"``);
and an Ultralytics-style ONNX detector whose INT8 model loses the class scores while its boxes stay close
(support/yolo_onnx.py), gated by parts of its output, by the shipped detection metric and by the user's own
metric from the model repo, and tuned by the fallback on images the gate does not judge."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from support import deploy_interpreter, nets
from support.project import REPO, run_quantflow

from quantflow.backends.deploy_mindspore import export_deploy_mindir
from quantflow.backends.deploy_onnx import check_deploy, deploy_model
from quantflow.engine.int8_emulator import Emulator
from quantflow.engine.runner import float_runner
from quantflow.frontends.mindir import read_mindir
from quantflow.quantization.calibrater import calibrate
from quantflow.quantization.deploy import quantized_graph
from quantflow.quantization.passes import fold_for_quantization
from quantflow.quantization.qparams import QuantParams
from quantflow.quantization.sensitivity import Agreement, analyse, rank

SHAPE = (2, 3, 32, 32)
HEADS = [(2, 27, 4, 4), (2, 27, 8, 8)]  # 3 anchors x (4 box + objectness + 4 classes), strides 8 and 4


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    net = nets.DetectorStyle()
    path = nets.export(net, tmp_path_factory.mktemp("det") / "det.mindir", shape=SHAPE)
    graph = read_mindir(path)
    folded = fold_for_quantization(graph)
    rng = np.random.default_rng(11)
    qp = calibrate(folded, [rng.normal(size=(16,) + SHAPE[1:]).astype(np.float32)], "minmax",
                   rollback_small_channels=False)
    return net, graph, folded, qp


def test_every_head_is_an_output_and_the_ir_equals_mindspore(detector):
    net, graph, _, _ = detector
    assert {"SiLU", "ResizeNearestNeighborV2", "Concat", "Sigmoid"} <= set(graph.op_counts())
    assert [tuple(graph.shape(o)) for o in graph.outputs] == HEADS
    x = np.random.default_rng(0).normal(size=SHAPE).astype(np.float32)
    got = float_runner(graph).run(x)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    want = [o.asnumpy() for o in net(ms.Tensor(x))]
    for name, w in zip(graph.outputs, want):
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5)


def test_every_head_quantizes_and_emulates_close_to_fp32(detector):
    _, graph, folded, qp = detector
    assert len(qp.ops) == sum(1 for n in folded.nodes if n.op == "Conv2D") == 7
    x = np.random.default_rng(1).normal(size=(8,) + SHAPE[1:]).astype(np.float32)
    fp = float_runner(graph).run(x)
    q = Emulator(quantized_graph(folded, qp)).outputs(x.astype(np.float16))
    for name in graph.outputs:
        diff = np.abs(fp[name] - q[name])
        # Sigmoid outputs in (0, 1): INT8 moves each by a few hundredths at most, on average by a small
        # part of the outputs' spread across images and positions
        assert 0 < diff.max() < 0.1 and diff.mean() < 0.1 * fp[name].std(), (name, diff.max(), diff.mean())


def test_deploy_graphs_compute_every_head_as_the_emulation_does(detector, tmp_path):
    _, _, folded, qp = detector
    x16 = np.random.default_rng(2).normal(size=SHAPE).astype(np.float16)
    emulated = Emulator(quantized_graph(folded, qp)).outputs(x16)
    model = deploy_model(quantized_graph(folded, qp), "x")
    check_deploy(model)
    assert len(model.graph.output) == len(HEADS)
    for got, name in zip(deploy_interpreter.run(model, x16), folded.outputs):
        np.testing.assert_array_equal(got, emulated[name])
    deploy = quantized_graph(folded, qp)
    export_deploy_mindir(deploy, tmp_path)
    back = read_mindir(tmp_path / "deploy.mindir")
    assert len(back.outputs) == len(HEADS)
    read_back = Emulator(back).outputs(x16)
    for a, b in zip(back.outputs, deploy.outputs):
        np.testing.assert_array_equal(read_back[a], emulated[b])


@pytest.mark.parametrize("name,ops,out_shape", [("AnchorDecode", {"Tile", "Stack"}, (2, 3, 2, 16)),
                                                ("SliceAssignDecode", {"TensorScatterUpdate", "Pow"}, (2, 32, 6))])
def test_box_decoding_runs_through_the_emulation_and_the_deploy_graphs(tmp_path, name, ops, out_shape):
    """YOLO-style box decodings after a quantized convolution (YOLOv8's: an anchor grid computed when read,
    Tile and Stack at run time; YOLOv5's: slice assignment and Pow): the deploy ONNX graph and the deploy
    MindIR compute them bit for bit as the emulation does."""
    shape = (2, 3, 16, 16)
    folded = fold_for_quantization(read_mindir(nets.export(getattr(nets, name)(), tmp_path / "a.mindir", shape=shape)))
    qp = calibrate(folded, [np.random.default_rng(4).normal(size=(8,) + shape[1:]).astype(np.float32)], "minmax",
                   rollback_small_channels=False)
    assert len(qp.ops) == 1
    x16 = np.random.default_rng(5).normal(size=shape).astype(np.float16)
    emulated = Emulator(quantized_graph(folded, qp)).outputs(x16)[folded.outputs[0]]
    fp = float_runner(folded).run(x16.astype(np.float32))[folded.outputs[0]]
    assert emulated.shape == out_shape and 0 < np.abs(emulated - fp).max() < 0.05 * np.abs(fp).max()
    model = deploy_model(quantized_graph(folded, qp), "x")
    check_deploy(model)
    np.testing.assert_array_equal(deploy_interpreter.run(model, x16)[0], emulated)
    export_deploy_mindir(quantized_graph(folded, qp), tmp_path)
    back = read_mindir(tmp_path / "deploy.mindir")
    assert ops <= set(back.op_counts())
    np.testing.assert_array_equal(Emulator(back).outputs(x16)[back.outputs[0]], emulated)


def test_the_per_layer_analysis_weighs_every_head(detector):
    """A layer that feeds only the fine head is ranked by what it does to the network's outputs, both heads
    pooled (the coarse head alone would not see it); each head's own figures are kept beside."""
    _, _, folded, qp = detector
    x = np.random.default_rng(3).normal(size=(4,) + SHAPE[1:]).astype(np.float32)
    sens = analyse(folded, qp, [x[:2], x[2:]])
    out_of = {n.name: n.outputs[0] for n in folded.nodes}
    fp32 = float_runner(folded, [out_of[q.node] for q in qp.ops])
    for q in qp.ops:
        emu = Emulator(quantized_graph(folded, QuantParams(qp.method, [q])))
        pooled, each = Agreement(), {o: Agreement() for o in folded.outputs}
        for batch in (x[:2], x[2:]):
            ref, got = fp32.run(batch), emu.outputs(batch.astype(np.float16))
            for o in folded.outputs:
                pooled.add(ref[o], got[o])
                each[o].add(ref[o], got[o])
        coarse = each[folded.outputs[0]]
        assert sens.row(q.node)["output"] == pooled.as_dict(), q.scope
        # and each head on its own, for the fallback to rank layers on the heads that fail
        assert sens.row(q.node)["per_output"] == {o: a.as_dict() for o, a in each.items()}, q.scope
        if q.scope.startswith("Default/fine"):
            assert pooled.sqnr_db < coarse.sqnr_db - 10  # its own head's error, not only float16's

DETECTOR_CONFIG = """
[model]
mindir = "det.mindir"
input_shape = [1, 3, 32, 32]
input_name = "x"

[normalization]
mean = [0.471, 0.463, 0.467]
std = [0.257, 0.260, 0.260]
scale = "0-1"
channel_order = "RGB"

[calibration]
data_dir = "calib"          # sub-folders sampled as groups: the images carry no labels
count = 40
per_class_min = 1
method = "minmax"

[evaluation]
data_dir = "heldout"        # images directly in it, and in a sub-folder
metric = "outputs"
min_cosine = 0.99

[aipp]
template = "static_rgb888_u8.cfg"
input_channel_order = "BGR"

[build]
output_dir = "build"
soc_version = "Ascend310P3"
"""


def test_a_detector_project_is_gated_on_every_output(tmp_path):
    """A folder holding a detector's MindIR, unlabelled images and a config builds with ``quantflow build``;
    the gate compares every head, a stricter limit fails naming the head, and the automatic fallback meets
    it by rolling layers back to float16."""
    from quantflow.backends.export import export_mindir

    project = tmp_path / "det"
    project.mkdir()
    export_mindir(nets.randomize(nets.DetectorStyle()), (1, 3, 32, 32), project / "det.mindir")
    shutil.copytree(REPO / "calib_data", project / "calib")
    (project / "heldout" / "night").mkdir(parents=True)
    held = sorted((REPO / "eval_data").glob("*/*.png"))[::12]
    for i, src in enumerate(held):
        shutil.copy2(src, project / "heldout" / ("night" if i % 4 == 0 else "") / f"frame_{i:03d}.png")
    (project / "quantflow.toml").write_text(DETECTOR_CONFIG)
    proc = run_quantflow(project, "build")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "folder:selected/available" in proc.stdout
    latest = json.loads((project / "build" / "latest.json").read_text())
    assert latest["gate"]["passed"] and latest["gate"]["metric"] == "outputs"
    gate_dir = Path(latest["artifacts"]["gate"])
    report = json.loads((gate_dir / "accuracy_report.json").read_text())
    assert report["images"] == len(held) and report["metric"] == "outputs"
    assert [o["shape"] for o in report["outputs"]] == [[1, 27, 4, 4], [1, 27, 8, 8]]
    for o in report["outputs"]:
        assert 0.99 <= o["cosine"] < 1 and o["sqnr_db"] > 10 and o["worst_image"].startswith("heldout")
        assert o["worst_image_cosine"] <= o["cosine"] + 1e-9
    assert 'id="per-output"' in (gate_dir / "report.html").read_text()
    assert "least cosine" in run_quantflow(project, "report").stdout

    least = report["least_cosine"]
    worst = next(o["output"] for o in report["outputs"] if o["cosine"] == least)
    strict = DETECTOR_CONFIG.replace("min_cosine = 0.99", f"min_cosine = {min(1.0, least + 1e-6):.7f}")
    (project / "strict.toml").write_text(strict)
    failed = run_quantflow(project, "build", "strict.toml")
    assert failed.returncode != 0
    out = failed.stdout + failed.stderr
    # a limit just above the figure is inside its interval: UNDECIDED, which evaluation.on_undecided = "fail" fails
    limit = float(f"{min(1.0, least + 1e-6):.7f}")
    assert "AccuracyGateError" in out and "UNDECIDED" in out and f"{worst} cosine {least:.6g}" in out
    assert f"(needs >= {limit:g}): UNDECIDED" in out

    # the automatic fallback rolls layers back to float16 until every output passes on its tuning images (here, as
    # evaluation.tune_from = "held_out" asks, half of each folder of the held-out images), each next layer the one
    # that harms the outputs still below the limit most; the gate judges the other half, and the report shows both
    from quantflow.config import load_config
    from quantflow.pipeline.doit_graph import artifact_status

    def fallback_build(name: str, limit: float, most: int):
        # recovery off: its costly methods run where the tuning check fails, so step 0 would differ between limits;
        # channel scales off: with them (quantization.channel_scale, the default) the tuning check already passes at
        # step 0 with the limit halfway from the tuning figure to 1, and no roll-back step is left to test
        (project / name).write_text(DETECTOR_CONFIG.replace("min_cosine = 0.99", f'min_cosine = {limit:.9f}\n'
                                                                                 'tune_from = "held_out"')
                                    + f'[quantization]\nfallback = "auto"\nmax_fallback = {most}\nrecover = "off"\n'
                                    + "channel_scale = false\n")
        proc = run_quantflow(project, "build", name)
        dirs = {k: v[1] for k, v in artifact_status(load_config(project / name)).items()}
        return (proc, json.loads((dirs["fallback"] / "fallback.json").read_text()),
                json.loads((dirs["gate"] / "accuracy_report.json").read_text()), dirs)

    _, fallback, gate, _ = fallback_build("tuning.toml", 0.99, 0)     # no layer rolled back: the tuning images' figure
    tuned_least = fallback["steps"][0]["least_cosine"]
    assert gate["tuning"]["figure"].startswith(f"least cosine {tuned_least:.5f}")
    limit = tuned_least + (1 - tuned_least) / 2
    rolled, fallback, gate, dirs = fallback_build("fallback.toml", limit, 7)
    steps, tuned = fallback["steps"], fallback["tuning"]["names"]
    sensitivity = json.loads((dirs["sensitivity"] / "sensitivity.json").read_text())
    assert not steps[0]["passed"] and steps[0]["least_cosine"] == tuned_least and len(steps) >= 2
    # the roll-back stops at a PASS on the tuning images (the gate fails UNDECIDED), where a layer rolled back on
    # trial past an UNDECIDED check brings the figures no closer (that layer put back), or at max_fallback
    final = next(s for s in reversed(steps) if not s.get("undone"))
    assert [f["node"] for f in final["float_ops"]] == [f["node"] for f in fallback["float_ops"]]
    assert final["verdict"] == "PASS" or steps[-1].get("undone") or len(final["float_ops"]) == 7
    kept, rejected = steps[0], set()
    for after in steps[1:]:
        short = kept["failures"] or kept["undecided"]   # what the next layer is chosen for: the last kept check's
        assert short and all(set(short) <= set(r["per_output"]) for r in sensitivity["ops"])
        done = [f["node"] for f in kept["float_ops"]]
        chosen = next(n for n in rank(sensitivity["ops"], short) if n not in done and n not in rejected)
        assert [f["node"] for f in after["float_ops"]] == done + [chosen]
        if after.get("undone"):    # it did not help: put back, never tried again
            rejected.add(chosen)
        else:
            kept = after
    assert "(below the limit: " + ", ".join(steps[0]["failures"]) + ")" in rolled.stdout
    assert set(tuned).isdisjoint(gate["judged"]) and len(tuned) + len(gate["judged"]) == len(held)
    assert gate["tuning"]["passed"] and f"the fallback tuned on {len(tuned)} other images" in rolled.stdout
    # the gate's verdict is its own figure on the images the fallback did not tune on, not the tuning figure
    assert gate["least_cosine"] != steps[-1]["least_cosine"]
    assert gate["passed"] == (gate["verdict"] == "PASS") and rolled.returncode == (0 if gate["passed"] else 1)
    assert all(o["worst_image"] in gate["judged"] for o in gate["outputs"])
    assert "<th>least cosine</th>" in (dirs["gate"] / "report.html").read_text()


# ---------------------------------------------------------------------------------------- concatenated heads
def _build(project: Path, name: str, evaluation: str, extra: str = ""):
    """``quantflow build`` of ``name`` (the project's config with these [evaluation] lines): (process, the gate's
    artifact folder, its accuracy report or None, latest.json)."""
    from quantflow.config import load_config
    from quantflow.pipeline.doit_graph import artifact_status

    text = (project / "quantflow.toml").read_text()
    start, end = text.index("[evaluation]"), text.index("[aipp]")
    (project / name).write_text(text[:start] + '[evaluation]\ndata_dir = "heldout"\n' + evaluation + "\n\n"
                                + text[end:] + extra)
    proc = run_quantflow(project, "build", name)
    gate = artifact_status(load_config(project / name))["gate"][1]
    found = gate / "accuracy_report.json"
    report = json.loads(found.read_text()) if found.is_file() else None
    return proc, gate, report, json.loads((project / "build" / "latest.json").read_text())


BEST_CLASS_METRIC = """
import numpy as np


def same_best_class(fp32, int8, batch, first=4):
    \"\"\"Per image: 1 when the best-scoring class over all anchors is the same in FP32 and INT8.\"\"\"
    f, q = fp32["output0"], int8["output0"]
    return {"same_best_class": f[:, first:].max(2).argmax(1) == q[:, first:].max(2).argmax(1)}
"""


@pytest.fixture(scope="module")
def yolo_project(tmp_path_factory):
    from support.yolo_onnx import project
    return project(tmp_path_factory.mktemp("yolo") / "repo", REPO, 'metric = "outputs"\nmin_cosine = 0.99')


@pytest.mark.slow
def test_int8_losing_the_class_scores_fails_by_part_by_detections_and_by_the_users_metric(yolo_project):
    """The output [1, 4 + 3, 64] holds boxes in pixels and scores in 0..1; this INT8 model loses the scores. The
    whole output's cosine passes 0.99 (the gate before parts saw nothing); the part "scores" fails by name; the
    shipped detection metric fails on F1; the user's own metric from a module beside the config reports its number
    and gates on it."""
    project = yolo_project
    proc, _, report, _ = _build(project, "whole.toml", 'metric = "outputs"\nmin_cosine = 0.99')
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (whole,) = report["outputs"]
    assert whole["output"] == "output0" and whole["shape"] == [1, 7, 64] and whole["cosine"] > 0.999

    parts = 'metric = "outputs"\nparts.boxes = { axis = 1, slice = "0:4" }\nparts.scores = { axis = 1, slice = "4:" }'
    proc, gate, report, _ = _build(project, "parts.toml", parts)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "AccuracyGateError: INT8 part scores of output output0 [:, 4:7] (cosine" in out
    rows = {r["part"] or r["output"]: r for r in report["outputs"]}
    assert rows["output0"]["passed"] is None and rows["output0"]["cosine"] == pytest.approx(whole["cosine"])
    assert rows["boxes"]["passed"] and rows["boxes"]["cosine"] > 0.9999
    assert not rows["scores"]["passed"] and rows["scores"]["cosine"] < 0.9 and report["failures"] == ["scores"]
    html = (gate / "report.html").read_text()
    assert "<td>scores</td>" in html and "INT8 part scores of output output0" in html
    # the failing gate's per-layer analysis measured each part on its own (the fallback ranks on a failing part)
    (analysis,) = (project / "build" / "artifacts" / "sensitivity").glob("*/sensitivity.json")
    ops = json.loads(analysis.read_text())["ops"]
    assert ops and all(set(r["per_part"]) == {"boxes", "scores"} for r in ops)
    assert min(r["per_part"]["scores"]["sqnr_db"] for r in ops) < min(r["per_part"]["boxes"]["sqnr_db"] for r in ops)
    # the message and the report rank the layers by the failing part, in the order the fallback takes them
    by_scores = [r["scope"] for r in sorted(ops, key=lambda r: (r["per_part"]["scores"]["sqnr_db"], r["node"]))]
    named = out[out.index("Most sensitive layers for part scores: "):].split(": ", 1)[1].split(". Try ")[0]
    assert [layer.split(" (part scores SQNR")[0] for layer in named.split("; ")] == by_scores[:len(named.split("; "))]
    assert "<th>part scores SQNR dB</th>" in html

    proc, _, report, _ = _build(project, "detection.toml", 'metric = "detection"')
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "task metric detection on INT8 against FP32: f1 " in out
    assert "does not meet evaluation.min.f1 0.9" in out
    n = report["numbers"]
    assert report["metric"] == "task" and n["fp32_detections"] > 100 and n["f1"] < 0.5 and report["failures"] == ["f1"]
    assert n["f1"] == pytest.approx(2 * n["matched"] / (n["fp32_detections"] + n["int8_detections"]))
    assert [r["output"] for r in report["outputs"]] == ["output0"] and report["outputs"][0]["passed"] is None

    (project / "best_class.py").write_text(BEST_CLASS_METRIC)
    mine = 'metric = "best_class:same_best_class"\nmin = { same_best_class = 0.99 }'
    proc, _, report, _ = _build(project, "mine.toml", mine)
    agree = report["numbers"]["same_best_class"]
    assert report["task"] == "best_class:same_best_class" and 0 < agree < 0.99 and proc.returncode == 1
    (f,) = report["figures"]                      # the number with its bootstrap interval over the images
    assert f["id"] == "same_best_class" and f["low"] <= agree <= f["high"] and f["verdict"] in ("FAIL", "UNDECIDED")
    assert f"same_best_class {agree:.6g} [" in proc.stdout + proc.stderr
    if f["verdict"] == "FAIL":
        said = f"same_best_class {agree:.4f} does not meet evaluation.min.same_best_class 0.99"
        assert said in proc.stdout + proc.stderr
    # a limit at the low end of the interval: PASS
    loose = math.floor(f["low"] * 1e4) / 1e4
    proc, _, report, latest = _build(project, "mine_loose.toml", mine.replace("0.99", f"{loose:.4f}"))
    assert proc.returncode == 0 and latest["gate"]["numbers"] == {"same_best_class": agree}
    assert f"same_best_class {agree:.4f} (needs >= {loose:g})" in latest["gate"]["verdict"]


@pytest.mark.slow
def test_the_fallback_tunes_on_images_the_gate_does_not_judge(yolo_project):
    """quantization.fallback = "auto" with the detection metric: by default the fallback tunes on calibration
    images beyond the calibration sample, rolls the score head back to float16, and the gate judges every held-out
    image; with evaluation.tune_from = "held_out" it tunes on half of each folder of the held-out images and the
    gate judges the other half; the sets are disjoint and the report shows both.  With evaluation.tune_dir the
    gate judges all of data_dir, and a tuning folder holding a held-out image is refused."""
    project = yolo_project
    auto = '\nfallback = "auto"\nmax_fallback = 2\n'   # in the config's [quantization] table (support/yolo_onnx.py)
    held = sorted(f"heldout/{p.name}" for p in (project / "heldout").glob("*.png"))
    proc, gate, report, latest = _build(project, "auto.toml", 'metric = "detection"', auto)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fallback = json.loads((Path(latest["artifacts"]["fallback"]) / "fallback.json").read_text())
    tuned, judged = fallback["tuning"]["names"], report["judged"]
    assert sorted(judged) == held and len(tuned) == 40 and all(n.startswith("calib/") for n in tuned)
    manifest = json.loads((project / "build" / "calibration" / "manifest.json").read_text())
    assert not set(tuned) & {i["path"] for i in manifest["images"]}     # beyond the calibration sample
    assert latest["float16_fallback"] == ["score"] and [s["passed"] for s in fallback["steps"]] == [False, True]
    assert report["images"] == 40 and report["tuning"]["images"] == 40 and report["passed"]
    assert fallback["tuning"]["source"].startswith("40 images of calibration.data_dir calib beyond the calibration "
                                                   "sample")
    # steered by the detection metric's own figure: the scores' SQNR where either network scores near the threshold
    assert fallback["steps"][1]["steering"]["value"] > fallback["steps"][0]["steering"]["value"]
    assert fallback["steps"][0]["steering"]["figure"] == "least SQNR dB (scores near the threshold)"

    proc, gate, report, latest = _build(project, "split.toml", 'metric = "detection"\ntune_from = "held_out"', auto)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fallback = json.loads((Path(latest["artifacts"]["fallback"]) / "fallback.json").read_text())
    tuned, judged = fallback["tuning"]["names"], report["judged"]
    assert set(tuned).isdisjoint(judged) and sorted(tuned + judged) == held and len(tuned) == len(judged) == 20
    assert latest["float16_fallback"] == ["score"] and [s["passed"] for s in fallback["steps"]] == [False, True]
    assert report["images"] == 20 and report["tuning"]["images"] == 20 and report["passed"]
    assert report["tuning"]["figure"].startswith("f1 ") and report["numbers"]["f1"] >= 0.9
    assert "the fallback tuned on 20 other images" in proc.stdout
    html = (gate / "report.html").read_text()
    assert ("<td>fallback tuned on</td><td>20 images: 50% of each folder of evaluation.data_dir heldout, drawn with "
            "evaluation.seed 0 (evaluation.tune_from = &quot;held_out&quot;)</td>") in html

    # a tuning folder of its own: the gate judges every held-out image
    shutil.copytree(REPO / "calib_data" / "3", project / "tune")
    proc, _, report, latest = _build(project, "tune.toml", 'metric = "detection"\ntune_dir = "tune"', auto)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fallback = json.loads((Path(latest["artifacts"]["fallback"]) / "fallback.json").read_text())
    assert report["images"] == 40 and sorted(report["judged"]) == held
    assert all(n.startswith("tune/") for n in fallback["tuning"]["names"]) and fallback["tuning"]["images"] == 30
    shutil.copy2(project / "heldout" / "frame_005.png", project / "tune" / "copy.png")
    proc, *_ = _build(project, "tune.toml", 'metric = "detection"\ntune_dir = "tune"', auto)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "evaluation.tune_dir tune and evaluation.data_dir heldout share 1 image(s)" in out
    assert "Traceback" not in out
