"""Train a demo network on the training split of scikit-learn's digits (CPU, about a minute)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import QuantflowError
from ..io.atomic import atomic_path
from . import data


def train(cfg, checkpoint_path: Path) -> dict:
    """Train, save ``checkpoint_path``, and return the metrics (held-out top-1 on ``evaluation.data_dir``, images,
    epochs, steps; the train stage keeps them in the checkpoint's record); fails below ``train.min_accuracy``."""
    import mindspore as ms

    mode = ms.get_context("mode")
    try:
        return _train(cfg, Path(checkpoint_path))
    finally:
        ms.set_context(mode=mode)


def _train(cfg, checkpoint_path: Path) -> dict:
    import mindspore as ms
    from mindspore import nn, Tensor

    from ..data.images import load_images, scan_class_folders
    from ..frontends.network import build_network

    tcfg = cfg.train
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(tcfg.seed)
    rng = np.random.default_rng(tcfg.seed)

    images, labels = data.make_images()
    train_idx, _, _ = data.split(labels)
    x_all = data.preprocess_batch(images[train_idx])
    y_all = labels[train_idx].astype(np.int32)

    net = build_network(cfg, load_weights=False)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    steps_per_epoch = int(np.ceil(len(x_all) / 32))
    lr = nn.cosine_decay_lr(2e-4, 1e-2, steps_per_epoch * tcfg.epochs, steps_per_epoch, tcfg.epochs)
    opt = nn.Adam(net.trainable_params(), learning_rate=lr, weight_decay=1e-4)

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    net.set_train(True)
    # train.steps stops the schedule of train.epochs early (a deliberately weak model): the learning rate is the
    # same as in the whole run up to that step
    last = steps_per_epoch * tcfg.epochs if tcfg.steps is None else min(tcfg.steps, steps_per_epoch * tcfg.epochs)
    steps = 0
    for epoch in range(tcfg.epochs):
        if steps >= last:
            break
        order = rng.permutation(len(x_all))
        losses = []
        for s in range(0, len(order), 32):
            if steps >= last:
                break
            steps += 1
            b = order[s:s + 32]
            xb = x_all[b]
            # light augmentation: random shifts of up to 2 pixels
            dx, dy = rng.integers(-2, 3, 2)
            xb = np.roll(xb, (int(dy), int(dx)), axis=(2, 3))
            losses.append(float(step(Tensor(xb), Tensor(y_all[b])).asnumpy()))
        stopped = f" (stopped at train.steps = {tcfg.steps})" if steps == last and tcfg.steps is not None else ""
        print(f"  epoch {epoch + 1}/{tcfg.epochs}: loss {np.mean(losses):.4f} over {len(losses)} steps{stopped}")
    net.set_train(False)

    # held-out accuracy on the shipped evaluation images (read from disk, as the gate does)
    items = scan_class_folders(cfg.path(cfg.evaluation.data_dir), cfg.model.num_classes)
    _, c, h, w = cfg.model.input_shape
    x_eval = data.preprocess_batch(load_images([i.path for i in items], c, h, w))
    y_eval = np.array([i.label for i in items])
    logits = np.concatenate([net(Tensor(x_eval[s:s + 128])).asnumpy() for s in range(0, len(x_eval), 128)])
    acc = float((logits.argmax(1) == y_eval).mean())

    checkpoint_path = Path(checkpoint_path)
    checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(checkpoint_path, in_folder=True) as tmp:
        ms.save_checkpoint(net, str(tmp))
    metrics = {"heldout_top1": acc, "heldout_images": int(len(y_eval)), "train_images": int(len(y_all)),
               "epochs": tcfg.epochs, "steps": steps}
    print(f"  FP32 held-out top-1: {acc:.4f} on {len(y_eval)} images")
    if acc < tcfg.min_accuracy:
        raise QuantflowError(f"training reached held-out top-1 {acc:.4f}, below train.min_accuracy={tcfg.min_accuracy}")
    return metrics
