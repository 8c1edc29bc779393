"""retrain: only with a ``[retrain]`` section: quantization-aware fine-tuning of the INT8 parameters in the
device's arithmetic (``quantflow.quantization.qat``, ``quantflow.quantization.retraining``), then the same path
as calibration's output: the learned weights (and ranges) quantized by the scheme into ``qparams``, which the
per-layer analysis, the fallback, the deploy graphs and the gate take from here (``inputs.parameters_dir``).

It starts from the parameters of the last parameter stage before it (``inputs.PARAMETER_STAGES``).  In ``distill``
mode ``retrain.validation`` of the calibration images are held out of the training (the rest and their
``retrain.variants`` are learned from; the default fewer where they would not fit in memory: ``variant_copies``); in
``labels`` mode the user's batches are learned from and every calibration image is a validation image.  Its record
``retrain.json``: the settings, the loss of every step, the time, where MindSpore trained, the images (``images``,
``validation_images``, ``variants``), and the distillation loss of the INT8 network on the validation images (on the
images learned from where ``validation`` is 0) as the emulator computes it before (``emulated_loss.before``), at the
equalized start of ``learn_scales`` with ``scales_init = "equalize"`` (``initial_scales``: the pairs rescaled, the
chains left alone, its emulated loss), at each of ``retrain.checkpoints`` (``checkpoints``: step and loss) and at
the best of them (``.retrained``, ``retrained_step``).  What it started from is kept unless the equalized start, and
then the retrained parameters, lower the loss beyond the sampling spread of the judged images (``choose``: a paired
bootstrap, as the gate's intervals; ``gains``); ``kept``: "retrained", "equalized" or "started from".
``retrained.ckpt``: the learned float weights and biases of the INT8 ops (BatchNorm folded: ``<node>.weight`` /
``<node>.bias``, and ``<node>.min_scale`` where a channel's weight step is held at the recovered one:
``qat.start_weight``) and the ranges (``<tensor>.range``), as a MindSpore checkpoint; ``network/``: the fake-quant
network's generated source.
"""
from __future__ import annotations

import json
import platform
from dataclasses import replace
from pathlib import Path

import numpy as np

from quantflow.errors import ConfigError, QuantflowError
from quantflow.io.atomic import atomic_path, write_json
from quantflow.quantization.qparams import QPARAMS_JSON, QPARAMS_NPZ, QuantParams

from .inputs import compared_regions, image_batches, parameters_dir, read_graph, recalibrator
from .stage import Stage

NAME = "retrain"
RETRAIN_JSON, RETRAINED_CKPT = "retrain.json", "retrained.ckpt"
# retrain.variants left unset: at most as many copies as keep the variants and the teacher's outputs of them (float32,
# held in memory for the whole training) within this; 4 copies of 160 MobileNet-digits images take 8 MB, of 400
# 640x640 detector images 20 GB
VARIANTS_BYTES = 2 ** 30


def variant_copies(r, learned: int, graph) -> int:
    """The variants of each calibration image learned from: ``retrain.variants`` as given, else its default capped
    so that the ``learned`` images' variants and their teacher outputs take at most ``VARIANTS_BYTES``."""
    if "variants" in r.model_fields_set:
        return r.variants
    per_image = 4 * sum(int(np.prod(graph.shape(t)[1:])) for t in [graph.inputs[0], *graph.outputs])
    return max(0, min(r.variants, VARIANTS_BYTES // max(1, per_image * learned)))


def _loss(cfg, graph, images: np.ndarray):
    """The distillation loss against the FP32 network's outputs on ``images``."""
    from quantflow.engine.runner import float_runner
    from quantflow.quantization.retraining import DistillLoss

    return DistillLoss(compared_regions(cfg, graph), list(graph.outputs), float_runner(graph).run(images))


def retrain_stage(cfg, kdir: Path, params_dir: Path, graph_dir: Path, calibration_paths: list[Path]) -> dict:
    import mindspore as ms

    from quantflow.entry import load_entry
    from quantflow.quantization.passes import fold_for_quantization
    from quantflow.quantization.qat import QAT_NET_PY, FakeQuantNet, requantize
    from quantflow.quantization.retraining import (emulated_losses, equalized_start, train_distill, train_labels,
                                                   validation_split, variants)

    r, kdir = cfg.retrain, Path(kdir)
    start = QuantParams.load(params_dir)
    folded = fold_for_quantization(read_graph(cfg, graph_dir))
    # the float network the parameters were made for: with recovery's equalized weights where it rescaled any
    graph = start.apply(folded)
    batches = list(image_batches(cfg, calibration_paths, cfg.calibration.batch_size))
    calibration = np.concatenate(batches)
    if r.mode == "distill":
        try:
            held, learn = validation_split(len(calibration), r.validation, r.seed)
        except ValueError as err:
            raise ConfigError(f"retrain.validation = {r.validation}: {err}") from None
        images = variants(calibration[learn], variant_copies(r, len(learn), graph), r.seed)
        judged = calibration[held] if len(held) else images
    else:
        images = judged = calibration
    validated = judged is not images or r.mode == "labels"   # judged on images it does not learn from
    loss = _loss(cfg, graph, images)
    judge = loss if judged is images else _loss(cfg, graph, judged)
    before = emulated_losses(graph, start, judged, judge)
    qp, initial, equalized = start, None, None
    if r.learn_scales and r.scales_init == "equalize":
        qp, eq = equalized_start(folded, start, [np.asarray(b) for b in batches],
                                 recalibrator(cfg, folded, calibration_paths))
        graph = qp.apply(folded)   # the same function as before, up to float rounding (equalization is exact)
        equalized = emulated_losses(graph, qp, judged, judge)
        initial = {"pairs": eq["pairs"], "left_alone": eq["left_alone"], "emulated_loss": float(equalized.mean())}
        print(f"channel scales start at cross-layer equalization's: {len(eq['pairs'])} pair(s) rescaled, INT8 "
              f"(emulated) loss {before.mean():.4g} -> {initial['emulated_loss']:.4g}")
    mode = ms.get_context("mode")
    try:
        try:
            ms.set_context(mode=ms.GRAPH_MODE if r.mode == "distill" else ms.PYNATIVE_MODE,
                           device_target=r.device_target)
        except (RuntimeError, ValueError) as err:
            raise ConfigError(f"retrain.device_target = {r.device_target!r}: MindSpore cannot train there on this "
                              f"machine ({str(err).splitlines()[0]})") from None
        ms.set_seed(r.seed)
        net = FakeQuantNet(graph, qp, kdir / "network", learn_ranges=r.learn_ranges, learn_scales=r.learn_scales)
        learned = (["weights"] + ["ranges"] * r.learn_ranges
                   + [f"channel scales of {len(net.pairs)} pair(s)"] * r.learn_scales)
        print(f"retraining {len(qp.ops)} INT8 ops ({r.mode}, {r.steps} steps, lr {r.lr}, {', '.join(learned)}"
              f"{'' if r.learn_ranges else '; ranges frozen'}) on {r.device_target}"
              + (f"; learning from {len(learn)} calibration images and {len(images) - len(learn)} variants"
                 if r.mode == "distill" and len(images) > len(learn) else "")
              + (f"; measured on {len(judged)} validation images at {r.checkpoints} checkpoint(s)"
                 if validated else ""))
        checkpoints, best = [], {}

        def measure(step: int) -> None:
            values = net.learned()
            # the float network: FP32's weights with the learned channel scales (a layer the fallback rolls back
            # later computes what FP32 does, and a rescaled pair stays matched)
            params = replace(requantize(qp, values, r.learn_ranges),
                             float_weights={**qp.float_weights, **net.float_weights()})
            losses = emulated_losses(graph, params, judged, judge)
            value = float(losses.mean())
            checkpoints.append({"step": step, "emulated_loss": value})
            if not best or value < best["loss"] or not np.isfinite(best["loss"]):
                pairs = [{"pair": p.describe(), "tensor": p.tensor, "scales": [float(s.min()), float(s.max())]}
                         for p, s in zip(net.pairs, net.channel_scales().values())]
                best.update(loss=value, losses=losses, step=step, params=params, values=values, pairs=pairs)
        try:
            if r.mode == "distill":
                run = train_distill(net, images, loss, r.steps, r.lr, r.batch_size, r.seed, scales_lr=r.scales_lr,
                                    checkpoints=r.checkpoints, on_checkpoint=measure)
            else:
                run = train_labels(net, load_entry(r.entry, "retrain.entry")(cfg, net.cell), r.steps, r.lr,
                                   scales_lr=r.scales_lr, checkpoints=r.checkpoints, on_checkpoint=measure)
        except (RuntimeError, TypeError, ValueError) as err:  # MindSpore's own errors are plain ones
            raise QuantflowError(f"retrain: training the fake-quant network {kdir / 'network' / QAT_NET_PY} failed"
                                 f"{' in retrain.entry ' + r.entry if r.entry else ''}: "
                                 f"{(str(err).strip().splitlines() or [type(err).__name__])[0]}") from None
    finally:
        ms.set_context(mode=mode)
    if not np.all(np.isfinite(run["losses"])):
        raise QuantflowError(f"retrain: the loss is not finite after {len(run['losses'])} steps (retrain.lr = {r.lr} "
                             f"too large?)")
    retrained, learned_values, after, pairs = best["params"], best["values"], best["loss"], best["pairs"]
    # what it started from, unless the equalized start and then the retrained parameters are better on the judged
    # images beyond their sampling spread
    candidates = [("started from", before, start)] + ([("equalized", equalized, qp)] if initial else []) + [
        ("retrained", best["losses"], retrained)]
    kept, gains = choose(candidates, cfg.evaluation)
    dict((k, p) for k, _, p in candidates)[kept].save(kdir)
    _save_checkpoint(kdir / RETRAINED_CKPT, learned_values, qp)
    record = {"mode": r.mode, "steps": r.steps, "lr": r.lr, "batch_size": r.batch_size, "seed": r.seed,
              "learn_ranges": r.learn_ranges, "learn_scales": r.learn_scales, "scales_init": r.scales_init,
              "scales_lr": r.scales_lr, "initial_scales": initial, "scaled_pairs": pairs,
              "device_target": r.device_target, "machine": platform.machine(),
              "images": int(len(calibration)), "validation": r.validation,
              "validation_images": int(len(judged)) if validated else 0,
              "variants": int(len(images) - len(calibration) + (len(judged) if judged is not images else 0)),
              "int8_ops": len(qp.ops), "losses": run["losses"],
              "seconds": round(run["seconds"], 3),
              "emulated_loss": {"before": float(before.mean()), "retrained": after},
              "checkpoints": checkpoints, "retrained_step": best["step"], "gains": gains,
              "kept": kept, "terms": [t[3] for t in loss.terms]}
    write_json(kdir / RETRAIN_JSON, record)
    return record


def choose(candidates: list, ev) -> tuple[str, dict]:
    """(the name kept, each later candidate's gain): ``candidates`` (name, per-image emulated losses on the judged
    images, parameters) in order, the first kept unless a later one's mean loss is lower than the kept one's
    beyond the sampling spread of those images: the paired bootstrap interval of the mean difference
    (``evaluation.confidence``, ``.resamples``, ``.seed``, as the gate's figures) lies above zero.  A gain: the
    mean loss lowered against the candidate kept before it, with its interval."""
    from quantflow.evaluation.intervals import interval, mean_replicates, resampling

    kept, losses = candidates[0][0], np.asarray(candidates[0][1], np.float64)
    draws = resampling(np.zeros(len(losses)), ev.resamples, ev.seed, ev.confidence)
    gains = {}
    for name, other, _ in candidates[1:]:
        diff = losses - np.asarray(other, np.float64)
        low, high = interval(mean_replicates(draws, diff), ev.confidence)
        gains[name] = {"against": kept, "gain": float(diff.mean()), "interval": [low, high],
                       "kept": bool(low > 0)}
        if low > 0:
            kept, losses = name, np.asarray(other, np.float64)
    return kept, gains


def _save_checkpoint(path: Path, learned: dict, qp: QuantParams) -> None:
    import mindspore as ms

    items, ranges = [], {}
    for q in qp.ops:
        v = learned[q.node]
        items += [{"name": f"{q.node}.weight", "data": ms.Tensor(v["weight"])},
                  {"name": f"{q.node}.bias", "data": ms.Tensor(v["bias"])}]
        if np.any(v.get("min_scale", 0) > 0):   # the least weight steps (qat.start_weight), where there are any
            items.append({"name": f"{q.node}.min_scale", "data": ms.Tensor(v["min_scale"])})
        ranges.setdefault(q.input, v["range"].astype(np.float32))
    items += [{"name": f"{t}.range", "data": ms.Tensor(v)} for t, v in ranges.items()]
    with atomic_path(path, in_folder=True) as tmp:
        ms.save_checkpoint(items, str(tmp))


def read(retrain_dir: Path) -> dict:
    return json.loads((Path(retrain_dir) / RETRAIN_JSON).read_text())


def _run(b) -> None:
    kdir = b.dir(NAME)
    rec = retrain_stage(b.cfg, kdir, parameters_dir(b, before=NAME), b.dir("graph"), b.calibration_paths())
    e, losses = rec["emulated_loss"], rec["losses"]
    # one batch's loss moves by 2-4x from step to step: the first and the last tenth of the steps, averaged
    tenth = max(1, len(losses) // 10)
    print(f"retrained in {rec['seconds']:.1f} s on {rec['device_target']}: training loss (mean of a tenth of the "
          f"steps) {np.mean(losses[:tenth]):.4g} -> {np.mean(losses[-tenth:]):.4g}; INT8 (emulated) on {judged_images(rec)} {e['before']:.4g} -> "
          + (f"{rec['initial_scales']['emulated_loss']:.4g} (equalized start) -> " if rec["initial_scales"] else "")
          + f"{e['retrained']:.4g} (step {rec['retrained_step']} of {rec['steps']})"
          + {"retrained": "", "equalized": " -- not better beyond the images' sampling spread: the equalized start "
                                           "is kept"}.get(
              rec["kept"], " -- not better beyond the images' sampling spread: the parameters it started from are "
                           "kept") +
          f" -> {kdir / QPARAMS_JSON}")


def judged_images(rec: dict) -> str:
    """The images retrain.json's emulated losses are measured on, in words."""
    if rec.get("validation_images"):
        return f"{rec['validation_images']} validation images"
    return f"{rec['images']} calibration images" + (f" and {rec['variants']} variants" if rec.get("variants") else "")


def _key_inputs(b) -> dict:
    c = b.cfg.model_dump(mode="json")
    r = b.cfg.retrain
    ev = c["evaluation"]
    key = {"retrain": c["retrain"], "parts": ev["parts"], "normalization": c["normalization"],
           "batch_size": c["calibration"]["batch_size"],
           # the keep rule's bootstrap (choose)
           "bootstrap": {k: ev[k] for k in ("confidence", "resamples", "seed")}}
    if r.entry:
        from quantflow.entry import module_file
        from quantflow.io.digest import file_sha256
        key["entry_sources"] = [file_sha256(Path(f)) for f in module_file(r.entry)]
    return key


def _summary(b) -> dict:
    d = b.dir(NAME)
    return {"retrained_checkpoint": str(d / RETRAINED_CKPT), "retrain_record": str(d / RETRAIN_JSON)}


STAGE = Stage(
    name=NAME, doc="quantization-aware fine-tuning in the device's arithmetic, then requantized (only with [retrain])",
    run=_run, needs=("sample", "graph", "calibrate", "recover"), key_inputs=_key_inputs, used=lambda cfg: cfg.retrain is not None,
    outputs=(QPARAMS_JSON, QPARAMS_NPZ, RETRAIN_JSON, RETRAINED_CKPT), summary=_summary)
