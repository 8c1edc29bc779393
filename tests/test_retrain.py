"""The retrain stage on the demo (DigitsNet): a few steps of distillation (and of a labelled loss) lower the INT8
network's error against FP32 as the emulator computes it, and the artifacts say what was trained and are
consistent with each other.  Nothing here depends on how the training goes on this processor beyond the loss
falling: values are checked against the artifacts and against independent runs of the emulator."""
from __future__ import annotations

import json

import numpy as np
import pytest

from quantflow.config import RetrainSection
from quantflow.engine.int8_emulator import Emulator
from quantflow.engine.runner import float_runner
from quantflow.quantization.deploy import quantized_graph
from quantflow.quantization.passes import fold_for_quantization
from quantflow.quantization.qparams import QuantParams


@pytest.fixture(scope="module")
def clipped_cfg(demo_cfg):
    """The demo calibrated with ranges that clip 1% of every quantized op's input (percentile 99): an INT8 error
    (about 1e-2 of the logits' energy) that a few steps of retraining can lower by a wide margin.  The demo's own
    mse calibration is within 3e-5 of FP32, too close for a few steps to improve reliably."""
    return demo_cfg.model_copy(update={"calibration": demo_cfg.calibration.model_copy(
        update={"method": "percentile", "percentile": 99.0})})


@pytest.fixture(scope="module")
def calibrated(clipped_cfg, tmp_path_factory):
    """The demo's graph and calibration stages run on 64 of its calibration images: (graph dir, calibrate dir,
    the images' paths)."""
    from tasks.calibrate import calibrate_stage
    from tasks.graph import graph_stage

    demo_cfg = clipped_cfg
    root = tmp_path_factory.mktemp("retrain")
    paths = sorted(demo_cfg.path(demo_cfg.calibration.data_dir).rglob("*.png"))[::3][:64]
    graph_dir, calibrate_dir = root / "graph", root / "calibrate"
    graph_dir.mkdir()
    calibrate_dir.mkdir()
    graph_stage(demo_cfg, graph_dir, paths)
    calibrate_stage(demo_cfg, calibrate_dir, paths, graph_dir)
    return graph_dir, calibrate_dir, paths


def relative_error(cfg, graph_dir, qparams_dir, paths, variants: int = 0) -> float:
    """sum (INT8 - FP32)^2 / sum FP32^2 of the logits on ``paths`` (and ``variants`` variants of each), INT8 by
    the emulator: the distillation loss of a one-output network, computed here on its own."""
    from quantflow.quantization.retraining import variants as with_variants
    from tasks.inputs import image_batches, read_graph

    graph = fold_for_quantization(read_graph(cfg, graph_dir))
    x = np.concatenate(list(image_batches(cfg, paths, 32)))
    x = with_variants(x, variants, cfg.retrain.seed) if variants else x
    fp32 = float_runner(graph).run(x)[graph.outputs[0]].astype(np.float64)
    int8 = Emulator(quantized_graph(graph, QuantParams.load(qparams_dir))).logits(x.astype(np.float16))
    return float(np.mean((int8 - fp32) ** 2) / np.mean(fp32 ** 2))


def run_retrain(cfg, calibrated, out, **settings):
    """The stage with ``settings``; ``validation`` 0 and no ``variants`` unless given, so that its losses are on the
    calibration images it learns from (the tests of the validation images and of the variants give them)."""
    from tasks.retrain import retrain_stage

    settings.setdefault("validation", 0.0)
    settings.setdefault("variants", 0)
    graph_dir, calibrate_dir, paths = calibrated
    cfg = cfg.model_copy(update={"retrain": RetrainSection(**settings)})
    out.mkdir()
    return cfg, retrain_stage(cfg, out, calibrate_dir, graph_dir, paths)


@pytest.mark.parametrize("learn_ranges", [False, True], ids=["weights", "weights-and-ranges"])
def test_a_few_distillation_steps_lower_the_int8_error_and_write_the_artifacts(clipped_cfg, calibrated, tmp_path,
                                                                              learn_ranges):
    import mindspore as ms

    from quantflow.quantization.qat import requantize
    from tasks.retrain import RETRAIN_JSON, RETRAINED_CKPT

    graph_dir, calibrate_dir, paths = calibrated
    out = tmp_path / "retrain"
    cfg, record = run_retrain(clipped_cfg, calibrated, out, steps=12, lr=1e-3, batch_size=16,
                              learn_ranges=learn_ranges)
    assert json.loads((out / RETRAIN_JSON).read_text()) == json.loads(json.dumps(record))
    assert record["steps"] == len(record["losses"]) == 12 and record["device_target"] == "CPU"
    assert record["seconds"] > 0 and record["images"] == len(paths) and record["learn_ranges"] == learn_ranges
    assert record["variants"] == 0
    before, after = relative_error(cfg, graph_dir, calibrate_dir, paths), relative_error(cfg, graph_dir, out, paths)
    assert record["emulated_loss"] == pytest.approx({"before": before, "retrained": after}, rel=1e-6)
    assert record["kept"] == "retrained" and after < before

    # the checkpoint holds what was learned, and the qparams are its quantization by the scheme
    calibrated_qp, retrained_qp = QuantParams.load(calibrate_dir), QuantParams.load(out)
    saved = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(out / RETRAINED_CKPT)).items()}
    learned = {q.node: {"weight": saved[f"{q.node}.weight"], "bias": saved[f"{q.node}.bias"],
                        "range": saved[f"{q.input}.range"].astype(np.float64)} for q in calibrated_qp.ops}
    again = requantize(calibrated_qp, learned, learn_ranges)
    assert [q.node for q in retrained_qp.ops] == [q.node for q in calibrated_qp.ops]
    assert [f.node for f in retrained_qp.float16] == [f.node for f in calibrated_qp.float16]
    for a, b, c in zip(again.ops, retrained_qp.ops, calibrated_qp.ops):
        np.testing.assert_array_equal(a.weight, b.weight)
        np.testing.assert_array_equal(a.bias, b.bias)
        assert (b.scale_d, b.offset_d) == ((a.scale_d, a.offset_d) if learn_ranges else (c.scale_d, c.offset_d))
    assert any(not np.array_equal(b.weight, c.weight) for b, c in zip(retrained_qp.ops, calibrated_qp.ops))


def test_distillation_learns_from_the_variants_too(clipped_cfg, calibrated, tmp_path):
    graph_dir, calibrate_dir, paths = calibrated
    out = tmp_path / "retrain"
    cfg, record = run_retrain(clipped_cfg, calibrated, out, steps=4, lr=1e-3, batch_size=16, variants=2)
    assert record["images"] == len(paths) and record["variants"] == 2 * len(paths)
    # the emulated losses are over the calibration images and their variants, as the stage's images are made
    before = relative_error(cfg, graph_dir, calibrate_dir, paths, variants=2)
    kept = relative_error(cfg, graph_dir, out, paths, variants=2)
    e = record["emulated_loss"]
    assert e["before"] == pytest.approx(before, rel=1e-6)
    assert kept == pytest.approx(e["retrained"] if record["kept"] == "retrained" else e["before"], rel=1e-6)
    assert before != pytest.approx(relative_error(cfg, graph_dir, calibrate_dir, paths), rel=1e-3)


@pytest.mark.parametrize("scales_init", ["equalize", "one"])
def test_learned_channel_scales_start_at_equalization_and_the_least_loss_is_kept(clipped_cfg, calibrated, tmp_path,
                                                                                scales_init):
    """learn_scales with scales_init = "equalize": the stage starts from cross-layer equalization's parameters
    (recorded with their emulated loss, which the start made again here gives; its FP32 network the original within
    float rounding) and keeps the parameters of the least of the emulated losses.  DigitsNet has no pair to rescale
    (pooling between its convolutions): the start is the calibrated parameters; test_qat has a network with pairs."""
    from quantflow.quantization.retraining import equalized_start
    from tasks.inputs import image_batches, read_graph, recalibrator

    graph_dir, calibrate_dir, paths = calibrated
    out = tmp_path / "retrain"
    cfg, record = run_retrain(clipped_cfg, calibrated, out, steps=4, lr=1e-3, batch_size=16, learn_scales=True,
                              scales_init=scales_init)
    e, init = record["emulated_loss"], record["initial_scales"]
    assert record["scales_init"] == scales_init and record["scaled_pairs"] == []
    losses = {"started from": e["before"], "retrained": e["retrained"]}
    if scales_init == "one":
        assert init is None
    else:
        assert init["pairs"] == [] and init["left_alone"] == []
        losses["equalized"] = init["emulated_loss"]
    # each later candidate is kept where its gain over the one kept before it is beyond the images' spread
    kept = "started from"
    for name in [n for n in ("equalized", "retrained") if n in losses]:
        gain = record["gains"][name]
        assert gain["against"] == kept and gain["gain"] == pytest.approx(losses[kept] - losses[name], rel=1e-6)
        assert gain["kept"] == (gain["interval"][0] > 0)
        kept = name if gain["kept"] else kept
    assert record["kept"] == kept
    assert relative_error(cfg, graph_dir, out, paths) == pytest.approx(losses[record["kept"]], rel=1e-6)

    if scales_init == "equalize":
        # the start, made again: its emulated loss is the one recorded, and its FP32 network is the original one
        folded = fold_for_quantization(read_graph(cfg, graph_dir))
        batches = [np.asarray(b) for b in image_batches(cfg, paths, cfg.calibration.batch_size)]
        start, _ = equalized_start(folded, QuantParams.load(calibrate_dir), batches,
                                   recalibrator(cfg, folded, paths))
        start.save(tmp_path / "start")
        assert relative_error(cfg, graph_dir, tmp_path / "start", paths) == pytest.approx(init["emulated_loss"],
                                                                                          rel=1e-6)
        x = np.concatenate(batches[:1])
        want = float_runner(folded).run(x)[folded.outputs[0]]
        got = float_runner(start.apply(folded)).run(x)[folded.outputs[0]]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_validation_images_are_held_out_and_judge_what_is_kept_at_the_best_checkpoint(clipped_cfg, calibrated,
                                                                                      tmp_path):
    from quantflow.quantization.retraining import validation_split

    graph_dir, calibrate_dir, paths = calibrated
    out = tmp_path / "retrain"
    cfg, record = run_retrain(clipped_cfg, calibrated, out, steps=6, lr=1e-3, batch_size=16, validation=0.25,
                              checkpoints=3, variants=1)
    held, learned = validation_split(len(paths), 0.25, cfg.retrain.seed)
    assert record["validation_images"] == len(held) == 16 and record["variants"] == len(learned) == 48
    # measured after steps 2, 4 and 6; the retrained loss is the best of them, and the parameters kept give, on the
    # held-out images alone, the loss recorded for them
    checks = record["checkpoints"]
    assert [c["step"] for c in checks] == [2, 4, 6]
    best = min(checks, key=lambda c: c["emulated_loss"])
    assert (record["retrained_step"], record["emulated_loss"]["retrained"]) == (best["step"], best["emulated_loss"])
    validation = [paths[i] for i in held]
    assert record["emulated_loss"]["before"] == pytest.approx(relative_error(cfg, graph_dir, calibrate_dir,
                                                                             validation), rel=1e-6)
    e = record["emulated_loss"]
    assert relative_error(cfg, graph_dir, out, validation) == pytest.approx(
        e["retrained"] if record["kept"] == "retrained" else e["before"], rel=1e-6)


def test_a_candidate_is_kept_only_where_its_gain_is_beyond_the_sampling_spread():
    from tasks.retrain import choose

    from quantflow.config import EvaluationSection

    ev = EvaluationSection(data_dir="eval", threshold=0.01)
    rng = np.random.default_rng(0)
    start = rng.uniform(1.0, 2.0, 40)
    clear = start * 0.5                                    # every image better
    # a lower mean resting on one image, the rest slightly worse: the heavy tail of a detector's scores
    lucky = start + 0.05
    lucky[0] -= 4.0
    assert lucky.mean() < start.mean()
    kept, gains = choose([("started from", start, None), ("retrained", lucky, None)], ev)
    assert kept == "started from" and not gains["retrained"]["kept"] and gains["retrained"]["interval"][0] <= 0
    kept, gains = choose([("started from", start, None), ("equalized", clear, None), ("retrained", clear * 0.99,
                                                                                         None)], ev)
    assert kept == "retrained" and gains["retrained"]["against"] == "equalized"
    assert gains["equalized"]["gain"] == pytest.approx((start - clear).mean())
    # the same draws every time (evaluation.seed)
    assert choose([("started from", start, None), ("retrained", lucky, None)], ev)[1] == \
        choose([("started from", start, None), ("retrained", lucky, None)], ev)[1]


def test_the_validation_split_is_seeded_disjoint_and_leaves_images_to_learn_from():
    from quantflow.quantization.retraining import checkpoint_steps, validation_split

    held, learned = validation_split(10, 0.2, 3)
    assert len(held) == 2 and len(learned) == 8 and sorted({*held, *learned}) == list(range(10))
    assert [a.tolist() for a in validation_split(10, 0.2, 3)] == [held.tolist(), learned.tolist()]
    assert validation_split(10, 0.2, 4)[0].tolist() != held.tolist() or validation_split(10, 0.2, 5)[0].tolist() \
        != held.tolist()
    assert len(validation_split(3, 0.01, 0)[0]) == 1     # a fraction above 0 holds out one image at least
    assert len(validation_split(3, 0.0, 0)[0]) == 0
    with pytest.raises(ValueError, match="holds out 1 of the 1 calibration images"):
        validation_split(1, 0.2, 0)
    assert checkpoint_steps(200, 5) == [40, 80, 120, 160, 200] and checkpoint_steps(3, 5) == [1, 2, 3]
    assert checkpoint_steps(7, 1) == [7]


def test_variants_are_shifted_and_contrast_scaled_copies():
    from quantflow.quantization.retraining import variants

    x = np.random.default_rng(1).normal(size=(5, 3, 16, 12)).astype(np.float32)
    assert variants(x, 0, 0) is x
    v = variants(x, 3, seed=7, max_shift=0.25, contrast=0.2)
    assert v.shape == (20, 3, 16, 12) and v.dtype == np.float32
    np.testing.assert_array_equal(v[:5], x)
    np.testing.assert_array_equal(v, variants(x, 3, seed=7, max_shift=0.25, contrast=0.2))  # seeded
    assert not np.array_equal(v[5:10], variants(x, 1, seed=8, max_shift=0.25, contrast=0.2)[5:])
    for k in range(5, 20):
        src, y = x[k % 5], v[k].astype(np.float64)
        # some shift (dy, dx) within 1/4 of each side, edges replicated, then contrast about the image's mean
        found = []
        for dy in range(-4, 5):
            for dx in range(-3, 4):
                moved = np.pad(src, ((0, 0), (4, 4), (3, 3)), mode="edge")[:, 4 - dy:20 - dy, 3 - dx:15 - dx]
                m = moved.astype(np.float64) - moved.mean()
                gain = float(np.sum(m * (y - moved.mean())) / np.sum(m * m))
                if 0.8 <= gain <= 1.2 and np.allclose(moved.mean() + gain * m, y, atol=1e-5):
                    found.append((dy, dx))
        assert found, f"variant {k} is not a shifted, contrast-scaled copy of image {k % 5}"


def labels_loss(cfg, network):
    """A ``retrain.entry`` for the labelled mode: cross-entropy on the demo's training split, 32 images a step."""
    import mindspore as ms
    from mindspore import nn

    from quantflow.demo import data

    images, labels = data.make_images()
    train, _, _ = data.split(labels)
    x, y = data.preprocess_batch(images[train[:256]]), labels[train[:256]].astype(np.int32)
    ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def loss(step):
        s = (32 * step) % len(x)
        return ce(network(ms.Tensor(x[s:s + 32])), ms.Tensor(y[s:s + 32]))
    return loss


def test_the_labelled_mode_trains_on_the_users_loss(clipped_cfg, calibrated, tmp_path):
    graph_dir, calibrate_dir, paths = calibrated
    out = tmp_path / "retrain"
    _, record = run_retrain(clipped_cfg, calibrated, out, mode="labels", entry="test_retrain:labels_loss", steps=6,
                            lr=1e-3)
    assert record["mode"] == "labels" and len(record["losses"]) == 6 and np.all(np.isfinite(record["losses"]))
    assert record["validation_images"] == len(paths)   # it learns from the user's batches, none of these
    # the parameters kept are the retrained ones where they lower the emulated error, else the calibrated ones
    e, kept = record["emulated_loss"], relative_error(clipped_cfg, graph_dir, out, paths)
    assert kept == pytest.approx(e["retrained"] if record["kept"] == "retrained" else e["before"], rel=1e-6)
    assert kept <= e["before"] * (1 + 1e-6)


def test_the_retrain_section_is_checked():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="retrain.entry is required"):
        RetrainSection(mode="labels")
    with pytest.raises(ValidationError, match="read only with"):
        RetrainSection(entry="m:f")
    assert RetrainSection().mode == "distill" and RetrainSection().device_target == "CPU"


def test_a_bare_retrain_section_takes_the_defaults_that_carry_the_imbalanced_example(demo_cfg):
    """``[retrain]`` with no key: what examples/mobilenet_v1_imbalanced/retrain.toml once had to set by hand (issue
    36: the old defaults left it 55 points down), the keep rule judging on a fifth of the images as before."""
    from quantflow.config import config_from_dict

    d = demo_cfg.model_dump(mode="json")
    r = config_from_dict({**d, "retrain": {}}, root=demo_cfg.root).retrain
    assert (r.mode, r.steps, r.lr, r.batch_size, r.variants) == ("distill", 200, 0.03, 32, 4)
    assert r.learn_ranges and r.learn_scales and r.scales_init == "equalize" and r.scales_lr == 0.03
    assert (r.validation, r.checkpoints, r.seed) == (0.2, 5, 0)


def test_default_variants_are_capped_by_memory_and_given_ones_are_not():
    from types import SimpleNamespace

    from tasks.retrain import VARIANTS_BYTES, variant_copies

    def graph(image: int, outputs: int):
        shapes = {"x": (1, 3, image, image), "y": (1, outputs)}
        return SimpleNamespace(inputs=["x"], outputs=["y"], shape=shapes.__getitem__)

    small, large = graph(32, 10), graph(640, 84 * 8400)
    assert variant_copies(RetrainSection(), 160, small) == 4
    assert variant_copies(RetrainSection(), 400, large) == 0   # 3 GB a copy
    per_copy = 4 * (3 * 224 * 224 + 1000) * 400
    assert variant_copies(RetrainSection(), 400, graph(224, 1000)) == min(4, VARIANTS_BYTES // per_copy)
    assert variant_copies(RetrainSection(variants=4), 400, large) == 4   # as the user gives it
    assert variant_copies(RetrainSection(variants=0), 160, small) == 0


def test_without_a_retrain_section_the_stage_is_not_in_the_build(demo_cfg):
    from quantflow.pipeline.build import Build
    from tasks import STAGES
    from tasks.inputs import parameters_stage

    plain, retrained = Build(demo_cfg), Build(demo_cfg.model_copy(update={"retrain": RetrainSection()}))
    assert "retrain" not in [s.name for s in plain.stages()] and "retrain" in [s.name for s in retrained.stages()]
    # the stages after it read the recovered parameters (the last parameter stage before it), needing what they
    # needed before the stage existed
    assert parameters_stage(demo_cfg) == "recover" and parameters_stage(retrained.cfg) == "retrain"
    assert parameters_stage(retrained.cfg, before="retrain") == "recover"
    for name in ("sensitivity", "fallback", "gate"):
        assert "retrain" not in plain.needs(STAGES[name]) and "retrain" in retrained.needs(STAGES[name])
        assert set(retrained.needs(STAGES[name])) - set(plain.needs(STAGES[name])) == {"retrain"}


def test_the_report_shows_the_loss_curve():
    from test_report import Report, gate_report

    from quantflow.report.html import render

    record = {"mode": "distill", "steps": 3, "lr": 1e-4, "int8_ops": 2, "learn_ranges": False, "device_target": "CPU",
              "seconds": 1.5, "images": 64, "losses": [3.0, 2.0, 1.0], "kept": "retrained",
              "emulated_loss": {"before": 2.5, "retrained": 1.2}}
    page = render("t", gate_report(), None, {}, None, record)
    assert page.count('<section id="retrain">') == 1 and 'alt="retraining loss"' in page
    text = Report(page).text("retrain")
    assert "3 steps of 2 INT8 ops" in text and "2.5 before, 1.2 retrained" in text
    assert '<section id="retrain">' not in render("t", gate_report(), None, {}, None)
    # started at equalization's scales, and that start kept
    record.update(kept="equalized", initial_scales={"pairs": [{}, {}], "left_alone": [], "emulated_loss": 1.1})
    text = Report(render("t", gate_report(), None, {}, None, record)).text("retrain")
    assert "the equalized parameters are used" in text and "equalization's (2 pair(s) rescaled; INT8 loss 1.1)" in text
    # judged on validation images, at checkpoints
    record.update(kept="retrained", validation_images=13, retrained_step=2,
                  checkpoints=[{"step": 2, "emulated_loss": 1.2}, {"step": 3, "emulated_loss": 1.4}])
    text = Report(render("t", gate_report(), None, {}, None, record)).text("retrain")
    assert "on 13 validation images" in text and "1.2 retrained (step 2; at the checkpoints: 1.2 at 2, 1.4 at 3)" in text
    # a gain not beyond the spread: the start kept, and the gain shown
    record.update(kept="started from", gains={"retrained": {"against": "started from", "gain": 0.004,
                                                            "interval": [-0.006, 0.02], "kept": False}})
    text = Report(render("t", gate_report(), None, {}, None, record)).text("retrain")
    assert "not better beyond the images' sampling spread: the parameters it started from are used (loss lowered " \
           "by 0.004 [-0.006, 0.02] against the parameters it started from)" in text


def failing_loss(cfg, network):
    def loss(step):
        raise ValueError("no labels here")
    return loss


def test_a_failing_training_is_one_message(demo_cfg, calibrated, tmp_path):
    from quantflow.errors import QuantflowError

    with pytest.raises(QuantflowError, match=r"retrain: training .*qat_net.py failed in retrain.entry "
                                             r"test_retrain:failing_loss: no labels here"):
        run_retrain(demo_cfg, calibrated, tmp_path / "retrain", mode="labels", entry="test_retrain:failing_loss",
                    steps=2)


def test_the_retrain_key_follows_the_keep_rules_bootstrap(demo_cfg):
    """The keep rule (``choose``) draws with evaluation's confidence, resamples and seed: a change reruns the stage."""
    from quantflow.pipeline.build import Build
    from tasks import STAGES

    cfg = demo_cfg.model_copy(update={"retrain": RetrainSection()})

    def own(**ev):
        return STAGES["retrain"].key_inputs(Build(cfg.model_copy(
            update={"evaluation": cfg.evaluation.model_copy(update=ev)})))

    base = own()
    assert all(own(**{k: v}) != base for k, v in (("confidence", 0.9), ("resamples", 500), ("seed", 1)))
    assert own(threshold=cfg.evaluation.threshold / 2) == base
