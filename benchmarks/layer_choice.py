"""Can any set of tuning images choose the layers to roll back?  Measured on a built top-1 classifier.

    doit config=examples/mobilenet_v3_small/quantflow.toml          # build it first (the gate may fail)
    python -m benchmarks.layer_choice examples/mobilenet_v3_small/quantflow.toml

The fallback rolls back one layer at a time, kept where it lowers INT8's mean KL divergence against FP32 on the
tuning images (``quantflow.evaluation.steering``).  That works where a layer's effect on the tuning images predicts
its effect on the images the gate judges.  On the parameters the fallback starts from (``tasks.inputs.
parameters_dir``: after the recovery), for each INT8 op rolled back alone to float16, this measures INT8's
per-image KL divergence on the gate's images and on the tuning images (``tasks.fallback.tuning_and_gate_sets``),
then:

- **tuning vs gate**: Spearman's rank correlation, over the ops, of the fall in mean KL each roll-back gives on
  the tuning images and on the gate's images;
- **split-half**: the same between two random halves of the gate's images (``--splits`` draws): how far the
  best possible tuning images -- unlabelled images of the gate's own kind, as many as half of them -- could
  predict the other half;
- **cross-fit**: the ``--pick`` ops whose single roll-back lowers the KL most on a random half A of the gate's
  images, rolled back together and judged on the other half B (``--cross`` draws): the KL on A and B against
  the start, and the images of B whose correctness against the labels INT8 changes (FP32 right and INT8 wrong,
  or the reverse) before and after.

Where the split-half correlation is near zero, per-layer effects are below the images' sampling noise at this
count: no choice of tuning images lets the fallback find layers that help on the gate's images, and more
held-out images (or a looser limit) are what decides the gate.  Measured: docs/accuracy.md, "The
MobileNetV3-small example".
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (no ties expected among float falls)."""
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--splits", type=int, default=50, help="random halvings for the split-half correlation")
    ap.add_argument("--cross", type=int, default=12, help="random halvings for the cross-fit")
    ap.add_argument("--pick", type=int, default=5, help="ops chosen on half A (the default max_fallback)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from quantflow.evaluation.steering import kl_divergence
    from quantflow.evaluation.top1 import fp32_logits, int8_logits, quantized_graph
    from quantflow.pipeline.build import open_build
    from quantflow.quantization.fallback import without
    from quantflow.quantization.passes import fold_for_quantization
    from quantflow.quantization.qparams import QuantParams
    from tasks.aipp import read_params
    from tasks.fallback import tuning_and_gate_sets
    from tasks.inputs import parameters_dir, read_graph

    b = open_build(args.config)
    cfg = b.cfg
    if cfg.evaluation.metric != "top1":
        raise SystemExit(f"{args.config}: evaluation.metric is {cfg.evaluation.metric!r}; this measures top-1 only")
    graph = read_graph(cfg, b.dir("graph"))
    folded = fold_for_quantization(graph)
    start = QuantParams.load(parameters_dir(b))
    aipp = read_params(b.dir("aipp"))
    tune, gate, how = tuning_and_gate_sets(cfg)
    if tune is None:
        raise SystemExit(f"{args.config}: quantization.fallback is 'off': no tuning images to compare")
    fp_gate, fp_tune = fp32_logits(gate, graph), fp32_logits(tune, graph)

    def int8(q):
        g = quantized_graph(folded, q)
        return int8_logits(gate, g, aipp), int8_logits(tune, g, aipp)

    nodes = [o.node for o in start.ops]
    print(f"{len(nodes)} INT8 ops; gate {len(gate.labels)} images, tuning {len(fp_tune)} ({how})", flush=True)
    q_gate, q_tune = int8(start)
    kl_gate = [kl_divergence(fp_gate, q_gate)]          # [1 + ops][gate images]: the start, then each roll-back
    kl_tune = [kl_divergence(fp_tune, q_tune).mean()]
    for n in nodes:
        g, t = int8(without(start, [n]))
        kl_gate.append(kl_divergence(fp_gate, g))
        kl_tune.append(kl_divergence(fp_tune, t).mean())
    kl_gate, kl_tune = np.array(kl_gate), np.array(kl_tune)
    fall_gate = kl_gate[0].mean() - kl_gate[1:].mean(1)
    fall_tune = kl_tune[0] - kl_tune[1:]
    print(f"mean KL at the start: gate {kl_gate[0].mean():.4f}, tuning {kl_tune[0]:.5f}")
    print(f"tuning vs gate: Spearman {spearman(fall_tune, fall_gate):+.2f} over {len(nodes)} ops")

    rng = np.random.default_rng(args.seed)
    n = len(gate.labels)
    halves = [rng.permutation(n) for _ in range(max(args.splits, args.cross))]
    rhos = []
    for p in halves[:args.splits]:
        a, c = p[:n // 2], p[n // 2:]
        rhos.append(spearman(kl_gate[0, a].mean() - kl_gate[1:, a].mean(1),
                             kl_gate[0, c].mean() - kl_gate[1:, c].mean(1)))
    print(f"split-half: Spearman {np.mean(rhos):+.2f} (mean of {args.splits} halvings, "
          f"range {min(rhos):+.2f} to {max(rhos):+.2f})")

    right = fp_gate.argmax(1) == gate.labels
    changed0 = right != (q_gate.argmax(1) == gate.labels)
    print(f"cross-fit: the {args.pick} ops whose roll-back lowers the KL most on half A, rolled back together")
    print("| draw | KL on A (chosen on), x start | KL on B (judged), x start | B's images INT8 changes: start -> after |")
    print("|---|---|---|---|")
    ratios_a, ratios_b, before, after = [], [], 0, 0
    for i, p in enumerate(halves[:args.cross]):
        a, c = p[:n // 2], p[n // 2:]
        pick = [nodes[j] for j in np.argsort(-(kl_gate[0, a].mean() - kl_gate[1:, a].mean(1)))[:args.pick]]
        q, _ = int8(without(start, pick))
        kl = kl_divergence(fp_gate, q)
        ra, rb = kl[a].mean() / kl_gate[0, a].mean(), kl[c].mean() / kl_gate[0, c].mean()
        changed = right != (q.argmax(1) == gate.labels)
        ratios_a.append(ra)
        ratios_b.append(rb)
        before += int(changed0[c].sum())
        after += int(changed[c].sum())
        print(f"| {i} | {ra:.2f} | {rb:.2f} | {int(changed0[c].sum())} -> {int(changed[c].sum())} |", flush=True)
    print(f"| mean / sum | {np.mean(ratios_a):.2f} | {np.mean(ratios_b):.2f} | {before} -> {after} |")


if __name__ == "__main__":
    main()
