"""A YOLO-style detector (tests/nets.py DetectorStyle: SiLU backbone, nearest upsampling, concatenation,
two Sigmoid heads) through the graph stages, every output checked: the IR against MindSpore, the INT8
emulation against FP32, the deploy ONNX graph and the deploy MindIR read back against the emulation; and a
detector project built with ``quantflow build`` and gated on every output (``evaluation.metric = "outputs"``)."""
from __future__ import annotations

import json
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
    assert "least output cosine" in run_quantflow(project, "report").stdout

    least = report["least_cosine"]
    worst = next(o["output"] for o in report["outputs"] if o["cosine"] == least)
    strict = DETECTOR_CONFIG.replace("min_cosine = 0.99", f"min_cosine = {min(1.0, least + 1e-6):.7f}")
    (project / "strict.toml").write_text(strict)
    failed = run_quantflow(project, "build", "strict.toml")
    assert failed.returncode != 0
    out = failed.stdout + failed.stderr
    assert "AccuracyGateError" in out and f"INT8 output(s) {worst} (cosine" in out
    assert "fall below evaluation.min_cosine" in out

    # the automatic fallback rolls layers back to float16 until every output passes, each next layer the one
    # that harms the outputs still below the limit most
    limit = least + (1 - least) / 2
    (project / "fallback.toml").write_text(
        DETECTOR_CONFIG.replace("min_cosine = 0.99", f"min_cosine = {limit:.9f}")
        + '[quantization]\nfallback = "auto"\nmax_fallback = 7\n')
    rolled = run_quantflow(project, "build", "fallback.toml")
    assert rolled.returncode == 0, rolled.stdout[-3000:] + rolled.stderr[-3000:]
    latest = json.loads((project / "build" / "latest.json").read_text())
    steps = json.loads((Path(latest["artifacts"]["fallback"]) / "fallback.json").read_text())["steps"]
    sensitivity = json.loads((Path(latest["artifacts"]["calibrate"]) / "sensitivity.json").read_text())
    assert not steps[0]["passed"] and steps[0]["least_cosine"] == pytest.approx(least, abs=1e-12)
    assert worst in steps[0]["failures"]
    assert steps[-1]["passed"] and steps[-1]["least_cosine"] >= limit and len(steps) >= 2
    assert steps[-1]["failures"] == []
    for before, after in zip(steps, steps[1:]):
        assert before["failures"] and all(set(before["failures"]) <= set(r["per_output"]) for r in sensitivity["ops"])
        done = [f["node"] for f in before["float_ops"]]
        chosen = next(n for n in rank(sensitivity["ops"], before["failures"]) if n not in done)
        assert [f["node"] for f in after["float_ops"]] == done + [chosen]
    assert "(below the limit: " + ", ".join(steps[0]["failures"]) + ")" in rolled.stdout
    assert latest["gate"]["passed"] and latest["float16_fallback"] == [f["scope"] for f in steps[-1]["float_ops"]]
    assert "<th>least output cosine</th>" in (Path(latest["artifacts"]["gate"]) / "report.html").read_text()
