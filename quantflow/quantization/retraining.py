"""Quantization-aware fine-tuning of the INT8 parameters: the fake-quant network (``qat.FakeQuantNet``) trained
with Adam, then requantized through the scheme (``FakeQuantNet.requantized``).

- ``distill`` (no labels): the FP32 network is the teacher on the calibration images; the loss is, summed over
  the regions the gate compares (every output whole, or the parts ``evaluation.parts`` names in its place), the
  squared error of the student's region against the teacher's relative to the teacher's energy there
  (``sum (s - t)^2 / sum t^2``: 1/SQNR, so a part of small values -- a detector's scores beside its boxes in
  pixels -- weighs as much as a large one);
- ``labels``: the user's loss, ``loss(step)`` from ``retrain.entry(config, network)``.

Distillation needs no labels, so it can learn from more than the calibration images: ``variants`` adds seeded
label-free variants of each (shifted, contrast changed), which the teacher labels by its own output.  On a few
hundred images the student otherwise learns those images' outputs, not the network's function (measured on the
imbalanced MobileNetV1 example: README, Retraining).

With ``learn_scales`` the channel scales start, where ``retrain.scales_init = "equalize"``, at cross-layer
equalization's closed form (``equalized_start``: ``recovery.equalize``'s scales on the pairs where the rescaling is
exact, folded into the float weights, the INT8 parameters calibrated again on them) and are learned from there, as
OmniQuant starts its learnable equivalent transformation at SmoothQuant's closed-form scales (Shao et al., ICLR
2024, sec. 3.3).  From one, the straight-through gradient alone has to find a 256x channel imbalance: measured on
the imbalanced MobileNetV1 example, it reaches 0.1-7x in 200-1000 steps (README, Retraining).

The learning rate decays from ``lr`` to a tenth of it over the steps (cosine).  ``train`` returns the loss of
every step; the retrain stage measures the result on the emulator (``emulated_loss``), which is what the device
computes, not the training network's float32 view of it.  It measures it on validation images the training never
sees (``validation_split``: a seeded part of the calibration images) at ``checkpoint_steps`` during the training
(``on_checkpoint``), and keeps the best point: on a few dozen images a network of many INT8 layers learns those
images, and its error on others can rise while the training loss falls (measured on NudeNet's YOLOv8n and PP-OCRv4
rec: docs/recovery.md, "Real models").
"""
from __future__ import annotations

import time

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from ..progress import progress


def variants(images: np.ndarray, copies: int, seed: int, max_shift: float = 0.125,
             contrast: float = 0.2) -> np.ndarray:
    """``images`` [N, C, H, W] followed by ``copies`` variants of each: translated by up to ``max_shift`` of the
    height and of the width (whole pixels, edges replicated) and with the contrast scaled by 1 +- ``contrast``
    about each image's mean, seeded.  No label is assumed to survive the change: the teacher labels each variant."""
    if copies <= 0:
        return images
    rng = np.random.default_rng(seed)
    n, _, h, w = images.shape
    out = [images]
    for _ in range(copies):
        dy = rng.integers(-int(h * max_shift), int(h * max_shift) + 1, n)
        dx = rng.integers(-int(w * max_shift), int(w * max_shift) + 1, n)
        gain = rng.uniform(1 - contrast, 1 + contrast, n).astype(images.dtype)
        rows = np.clip(np.arange(h)[None, :] - dy[:, None], 0, h - 1)  # [N, H]: the source row of each row
        cols = np.clip(np.arange(w)[None, :] - dx[:, None], 0, w - 1)
        moved = images[np.arange(n)[:, None, None, None], np.arange(images.shape[1])[None, :, None, None],
                       rows[:, None, :, None], cols[:, None, None, :]]
        mean = moved.mean(axis=(1, 2, 3), keepdims=True)
        out.append((mean + gain[:, None, None, None] * (moved - mean)).astype(images.dtype))
    return np.concatenate(out)


def validation_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(held-out, learned) indices of ``n`` images: ``round(n * fraction)`` held out (at least one where
    ``fraction`` > 0), chosen by ``seed``, both sorted.  ValueError where no image would be left to learn from."""
    held = 0 if fraction <= 0 else max(1, int(round(n * fraction)))
    if held >= n:
        raise ValueError(f"holds out {held} of the {n} calibration images, leaving none to learn from")
    order = np.random.default_rng([seed, n]).permutation(n)
    return np.sort(order[:held]), np.sort(order[held:])


def checkpoint_steps(steps: int, count: int) -> list[int]:
    """``count`` steps (1-based, after which the parameters are measured) spread evenly over ``steps``, the last
    step always one of them."""
    return sorted({max(1, int(round(steps * k / count))) for k in range(1, count + 1)})


class DistillLoss:
    """The distillation loss (module doc) over ``regions`` (``quantflow.evaluation.parts.Region``s, each output
    once: ``parts.finest``; ``output`` the name of each in ``outputs``), against ``teacher``: output name -> FP32
    outputs of all the images."""

    def __init__(self, regions: list, outputs: list[str], teacher: dict[str, np.ndarray]):
        self.terms = []
        for r in regions:
            t = teacher[r.output]
            sel = r.index
            energy = float(np.mean(np.square(t[sel], dtype=np.float64))) or 1.0
            self.terms.append((outputs.index(r.output), sel, energy, r.label))
        self.teacher = [teacher[o] for o in outputs]

    def numpy(self, student: list[np.ndarray], index=slice(None)) -> float:
        """The loss of ``student`` (the outputs, in order) against the teacher's ``index`` images."""
        return float(self.per_image(student, index).mean())

    def per_image(self, student: list[np.ndarray], index=slice(None)) -> np.ndarray:
        """The loss of each image (first axis) of ``student`` against the teacher's ``index`` images: their mean is
        the loss (every image has as many values in each region)."""
        total = 0.0
        for i, sel, energy, _ in self.terms:
            d = np.asarray(student[i], np.float64) - self.teacher[i][index]
            sq = np.square(d)[sel] if sel else np.square(d)
            total = total + sq.reshape(len(d), -1).mean(axis=1) / energy
        return np.asarray(total, np.float64)

    def mindspore(self, student, teacher):
        """The same on MindSpore tensors: ``student`` / ``teacher`` tuples of the outputs of one batch."""
        total = 0.0
        for i, sel, energy, _ in self.terms:
            d = student[i] - teacher[i]
            if sel:
                d = d[sel]
            total = total + ops.square(d).mean() / energy
        return total


def _log(bar, step: int, steps: int, losses: list[float], start: float) -> None:
    """The loss beside the bar; without a terminal (no bar) a line at every tenth of the steps."""
    bar.set_postfix(loss=f"{losses[-1]:.4g}")
    bar.update(1)
    if bar.disable and (step + 1) % max(1, steps // 10) == 0:
        print(f"  retrain step {step + 1}/{steps}: loss {np.mean(losses[-max(1, steps // 10):]):.4g} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)


def _schedule(lr: float, steps: int):
    return ms.Tensor(np.array([lr * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * s / steps))) for s in range(steps)],
                              np.float32))


def _optimizer(net, lr: float, steps: int, scales_lr: float):
    """Adam on ``net.trainable``; the channel scales' logarithms (``learn_scales``) at their own rate: they must
    travel a channel range ratio's logarithm (256x: 5.5) in the steps a weight moves by a few percent."""
    scales = net.scale_parameters()
    others = [p for p in net.trainable if all(p is not q for q in scales)]
    groups = [{"params": others}] + ([{"params": scales, "lr": _schedule(scales_lr, steps)}] if scales else [])
    return nn.Adam(groups, learning_rate=_schedule(lr, steps))


def _checkpoint(on_checkpoint, at: set, step: int, spent: list) -> None:
    if on_checkpoint is not None and step in at:
        t = time.perf_counter()
        on_checkpoint(step)
        spent.append(time.perf_counter() - t)


def train_distill(net, images: np.ndarray, loss: DistillLoss, steps: int, lr: float, batch_size: int, seed: int,
                  jit: bool = True, scales_lr: float = 0.0, checkpoints: int = 1, on_checkpoint=None) -> dict:
    """``steps`` Adam steps of ``net`` (``qat.FakeQuantNet``) on batches of ``images`` (float32, the training
    preprocessing), drawn without replacement in a seeded order, the channel scales at ``scales_lr``;
    ``on_checkpoint(step)`` after each of ``checkpoint_steps(steps, checkpoints)``; returns {"losses", "seconds"}
    (the training's, without the checkpoints' time)."""
    rng = np.random.default_rng(seed)
    teacher = loss.teacher
    opt = _optimizer(net, lr, steps, scales_lr)

    def forward(x, *t):
        out = net.cell(x)
        return loss.mindspore(out if isinstance(out, tuple) else (out,), t)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    def step(x, *t):
        value, grads = grad_fn(x, *t)
        opt(grads)
        return value

    step = ms.jit(step) if jit else step
    batch = min(batch_size, len(images))
    order, losses, at, spent = np.array([], int), [], set(checkpoint_steps(steps, checkpoints)), []
    net.cell.set_train(True)
    start = time.perf_counter()
    with progress(steps, "retrain", unit="step") as bar:
        for s in range(steps):
            if len(order) < batch:
                order = np.concatenate([order, rng.permutation(len(images))])
            idx, order = order[:batch], order[batch:]
            value = step(ms.Tensor(images[idx]), *(ms.Tensor(t[idx]) for t in teacher))
            losses.append(float(value.asnumpy()))
            _log(bar, s, steps, losses, start)
            _checkpoint(on_checkpoint, at, s + 1, spent)
    net.cell.set_train(False)
    return {"losses": losses, "seconds": time.perf_counter() - start - sum(spent)}


def train_labels(net, loss_of_step, steps: int, lr: float, scales_lr: float = 0.0, checkpoints: int = 1,
                 on_checkpoint=None) -> dict:
    """``steps`` Adam steps on the user's ``loss_of_step(step)`` (a MindSpore scalar computed with ``net.cell``),
    in MindSpore's PyNative mode (the user's code loads its batches in Python); checkpoints as ``train_distill``."""
    opt = _optimizer(net, lr, steps, scales_lr)
    losses, at, spent = [], set(checkpoint_steps(steps, checkpoints)), []
    net.cell.set_train(True)
    start = time.perf_counter()
    with progress(steps, "retrain", unit="step") as bar:
        for s in range(steps):
            value, grads = ms.value_and_grad(lambda: loss_of_step(s), None, opt.parameters)()
            opt(grads)
            losses.append(float(value.asnumpy()))
            _log(bar, s, steps, losses, start)
            _checkpoint(on_checkpoint, at, s + 1, spent)
    net.cell.set_train(False)
    return {"losses": losses, "seconds": time.perf_counter() - start - sum(spent)}


def equalized_start(graph, qparams, inputs: list[np.ndarray], recalibrate) -> tuple:
    """(``qparams`` with cross-layer equalization's scales folded into the float weights and calibrated again by
    ``recalibrate``, the record of the pairs rescaled and left alone): the channel scales' start for
    ``scales_init = "equalize"``.  ``graph`` is the BatchNorm-folded network without ``qparams``' float weights
    applied (the recovery's ``Context.graph``); ``inputs`` the batches its channel ranges are measured on."""
    from .recovery import METHODS, Context

    return METHODS["equalize"].run(Context(graph, inputs, recalibrate), qparams)


def emulated_losses(graph, qparams, images: np.ndarray, loss: DistillLoss) -> np.ndarray:
    """The distillation loss of the INT8 network as the emulator computes it (the device's arithmetic) on each of
    ``images`` (all of the teacher's)."""
    from ..engine.int8_emulator import Emulator
    from .deploy import quantized_graph

    emulator = Emulator(quantized_graph(graph, qparams))
    outs = emulator.outputs(images.astype(np.float16))
    return loss.per_image([outs[o] for o in graph.outputs])


def emulated_loss(graph, qparams, images: np.ndarray, loss: DistillLoss) -> float:
    """``emulated_losses``' mean: the loss on all of ``images``."""
    return float(emulated_losses(graph, qparams, images, loss).mean())
