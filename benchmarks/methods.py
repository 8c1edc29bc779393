"""Range methods side by side: quantflow's against onnxruntime's quantize_static, on the shipped demos.

    python -m benchmarks.methods            # trains missing demo checkpoints first (a few minutes)
    python -m benchmarks.methods --demos '' --zoo all   # model-zoo families, random weights: logits SQNR

For each demo network (trained weights; see ``DEMOS``), the same calibration images (every image
in calib_data/, 300) and the same held-out images (eval_data/, 359; the MobileNetV2 demo on a
harder copy: quantflow.demo.data.perturb, i.e. affine changes, blur and noise):

- FP32: the graph IR in onnxruntime on the training preprocessing;
- quantflow minmax / percentile / kl (guarded) / kl plain / mse: the Ascend INT8 emulation, fed
  the AIPP output (float16) of each uint8 image, as the gate computes it;
- onnxruntime MinMax / Entropy / Percentile: ``quantize_static`` (QDQ, per-channel weights) of the
  FP32 ONNX that quantflow writes from its IR, run by onnxruntime.

Prints one table: top-1 and drop (points) per method and demo.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEMOS = {  # name: (config, evaluation on the perturbed copy)
    "digits": ("quantflow.toml", False),
    "mbv2-hard": ("examples/mobilenet_v2/quantflow.toml", True),
    "mbv1-imbalanced": ("examples/mobilenet_v1_imbalanced/quantflow.toml", False),
}
QF_METHODS = {"minmax": ("minmax", 0.01), "percentile": ("percentile", 0.01), "kl": ("kl", 0.01),
              "kl plain": ("kl", 1.0), "mse": ("mse", 0.01)}
ORT_METHODS = ("MinMax", "Entropy", "Percentile")


def _checkpoint(cfg) -> None:
    from quantflow.entry import load_entry
    ckpt = cfg.path(cfg.model.checkpoint)
    if not ckpt.is_file():
        print(f"training {cfg.model.entry} -> {ckpt}", flush=True)
        load_entry(cfg.train.entry, "train.entry")(cfg, ckpt)


def _images(folder: Path, num_classes: int):
    from quantflow.data.images import load_images, scan_class_folders
    items = scan_class_folders(folder, num_classes)
    return load_images([i.path for i in items], 3, 32, 32), np.array([i.label for i in items])


def _ort_top1(fp32_onnx: Path, method: str, cal: np.ndarray, x: np.ndarray, labels: np.ndarray, out: Path) -> float:
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, quantize_static

    from quantflow.engine.runner import Runner

    batches = [cal[s:s + 32] for s in range(0, len(cal) - len(cal) % 32, 32)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(batches)

        def get_next(self):
            b = next(self.it, None)
            return None if b is None else {"x": b}

    quantize_static(str(fp32_onnx), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    calibrate_method=getattr(CalibrationMethod, method))
    logits = Runner(onnx.load(str(out)), "x", 32).run(x)[onnx.load(str(out)).graph.output[0].name]
    return float((logits.argmax(1) == labels).mean())


def evaluate_demo(name: str, workdir: Path) -> dict:
    import onnx

    from quantflow.backends import aipp
    from quantflow.backends.export import export_mindir
    from quantflow.config import load_config
    from quantflow.demo.data import perturb
    from quantflow.engine.runner import float_runner
    from quantflow.engine.lowering import lower
    from quantflow.engine.int8_emulator import Emulator
    from quantflow.quantization.deploy import quantized_graph
    from quantflow.frontends.mindir import read_mindir
    from quantflow.data.images import preprocess
    from quantflow.frontends.network import build_network
    from quantflow.engine.aipp import aipp_batch
    from quantflow.quantization.calibrater import calibrate
    from quantflow.quantization.passes import fold_for_quantization

    config, hard = DEMOS[name]
    cfg = load_config(ROOT / config)
    _checkpoint(cfg)
    n, k = cfg.normalization, cfg.model.num_classes
    graph = read_mindir(export_mindir(build_network(cfg), (32, 3, 32, 32), workdir / f"{name}.mindir"))
    folded = fold_for_quantization(graph)
    cal_u8, _ = _images(cfg.path(cfg.calibration.data_dir), k)
    ev_u8, labels = _images(cfg.path(cfg.evaluation.data_dir), k)
    if hard:
        ev_u8 = perturb(ev_u8)
    pre = lambda u8: preprocess(u8, n.mean, n.std, n.scale, n.channel_order)  # noqa: E731
    cal, ev = pre(cal_u8), pre(ev_u8)
    params = aipp.parse(aipp.render(cfg.aipp_template, aipp.aipp_values(
        cfg.model.input_shape, n.mean, n.std, n.scale, n.channel_order, cfg.aipp.input_channel_order)))
    ev16 = aipp_batch(params, ev_u8, cfg.aipp.input_channel_order)
    fp_top1 = float((float_runner(graph).run(ev)[graph.outputs[0]].argmax(1) == labels).mean())
    row = {"demo": name, "eval": f"{len(labels)}{' perturbed' if hard else ''}", "fp32": fp_top1}
    batches = [cal[s:s + 32] for s in range(0, len(cal), 32)]
    for label, (method, max_clipped) in QF_METHODS.items():
        qp = calibrate(folded, batches, method, kl_max_clipped=max_clipped)
        row[f"qf {label}"] = float((Emulator(quantized_graph(folded, qp)).logits(ev16).argmax(1) == labels).mean())
    fp32_onnx = workdir / f"{name}_fp32.onnx"
    onnx.save(lower(folded, "float32", input_name="x"), str(fp32_onnx))
    for method in ORT_METHODS:
        row[f"ort {method}"] = _ort_top1(fp32_onnx, method, cal, ev, labels, workdir / f"{name}_{method}.onnx")
    return row


ZOO = ("resnet18", "mobilenet_v2_100", "mobilenet_v3_small_100", "efficientnet_b0", "densenet121",
       "shufflenet_v2_x1_0", "regnet_x_200mf", "convnext_tiny")
ZOO_SIZE = 64


def evaluate_zoo(arch: str, workdir: Path) -> dict:
    """Random weights (accuracy means nothing): the SQNR (dB) of the INT8 emulation's logits against FP32
    and the top-1 agreement, per quantflow method, on 128 held-out digits upscaled to 64x64."""
    import cv2

    from quantflow.backends.export import export_mindir
    from quantflow.demo.data import MEAN_RGB, STD_RGB
    from benchmarks.zoo import create, randomize
    from quantflow.engine.runner import float_runner
    from quantflow.engine.int8_emulator import Emulator
    from quantflow.quantization.deploy import quantized_graph
    from quantflow.frontends.mindir import read_mindir
    from quantflow.data.images import preprocess
    from quantflow.quantization.calibrater import calibrate
    from quantflow.quantization.passes import fold_for_quantization
    from quantflow.quantization.sensitivity import Agreement

    graph = read_mindir(export_mindir(randomize(create(arch)), (32, 3, ZOO_SIZE, ZOO_SIZE), workdir / f"{arch}.mindir"))
    folded = fold_for_quantization(graph)
    up = lambda u8: np.stack([cv2.resize(i, (ZOO_SIZE, ZOO_SIZE), interpolation=cv2.INTER_LINEAR) for i in u8])  # noqa: E731
    pre = lambda u8: preprocess(up(u8), MEAN_RGB, STD_RGB, "0-1", "RGB")  # noqa: E731
    cal = pre(_images(ROOT / "calib_data", 10)[0][::2][:128])
    ev = pre(_images(ROOT / "eval_data", 10)[0][::2][:128])
    fp = float_runner(graph).run(ev)[graph.outputs[0]]
    row = {"arch": arch}
    for label, (method, max_clipped) in QF_METHODS.items():
        qp = calibrate(folded, [cal[s:s + 32] for s in range(0, len(cal), 32)], method, kl_max_clipped=max_clipped)
        q = Emulator(quantized_graph(folded, qp)).logits(ev.astype(np.float16))
        a = Agreement()
        a.add(fp, q)
        row[label] = (a.sqnr_db, float((fp.argmax(1) == q.argmax(1)).mean()))
    return row


def format_zoo(rows: list[dict]) -> str:
    head = "| architecture (random weights, 64x64) | " + " | ".join(QF_METHODS) + " |"
    lines = [head, "|" + "---|" * (1 + len(QF_METHODS))]
    for r in rows:
        lines.append(f"| {r['arch']} | " + " | ".join(f"{r[m][0]:.1f} dB / {r[m][1] * 100:.0f}%" for m in QF_METHODS)
                     + " |")
    means = {m: np.mean([r[m][0] for r in rows]) for m in QF_METHODS}
    lines.append("| mean SQNR | " + " | ".join(f"{means[m]:.1f} dB" for m in QF_METHODS) + " |")
    lines.append("")
    lines.append("logits SQNR of the INT8 emulation against FP32 / top-1 agreement, 128 digits upscaled to 64x64")
    return "\n".join(lines)


def format_table(rows: list[dict]) -> str:
    cols = [f"qf {m}" for m in QF_METHODS] + [f"ort {m}" for m in ORT_METHODS]
    head = "| demo | held-out | FP32 | " + " | ".join(cols) + " |"
    lines = [head, "|" + "---|" * (3 + len(cols))]
    for r in rows:
        cells = [f"{r[c] * 100:.2f} ({(r[c] - r['fp32']) * 100:+.2f})" for c in cols]
        lines.append(f"| {r['demo']} | {r['eval']} | {r['fp32'] * 100:.2f} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("top-1 % (change against FP32, points); qf: quantflow's Ascend INT8 emulation from the AIPP "
                 "output; ort: onnxruntime quantize_static (QDQ, per-channel) on the same FP32 graph and images")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demos", default=",".join(DEMOS), help=f"comma-separated, from {', '.join(DEMOS)}; "
                                                               f"'' for none")
    ap.add_argument("--zoo", default="", help=f"comma-separated mindcv architectures, or 'all' for {', '.join(ZOO)}")
    a = ap.parse_args(argv)
    rows, zoo = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in filter(None, a.demos.split(",")):
            rows.append(evaluate_demo(name.strip(), Path(tmp)))
            print(format_table(rows[-1:]).splitlines()[2], flush=True)
        for arch in ZOO if a.zoo == "all" else filter(None, a.zoo.split(",")):
            zoo.append(evaluate_zoo(arch.strip(), Path(tmp)))
            print(format_zoo(zoo[-1:]).splitlines()[2], flush=True)
    if rows:
        print()
        print(format_table(rows))
    if zoo:
        print()
        print(format_zoo(zoo))


if __name__ == "__main__":
    main()
