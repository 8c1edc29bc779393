"""Benchmark: quantflow against onnxruntime on the same graphs and images (one table, one run).

    python -m benchmarks.bench                       # DigitsNet, the MobileNetV2 demo, ResNet-18 at 224
    python -m benchmarks.bench --models digits --images 200 --eval 359

For each network (random weights: speed does not depend on them), exported from MindSpore at batch
32 and read into quantflow's IR:

- calibration: quantflow's Calibrater (minmax and kl) vs onnxruntime.quantization.quantize_static
  (MinMax, QDQ, per-channel) on the same images in the same batches;
- INT8 throughput: quantflow's bit-exact Ascend emulation vs onnxruntime running its own INT8 QDQ model;
- FP32 throughput: the IR as ONNX in onnxruntime (throughputs: best of 3 interleaved rounds);
- the default calibration (mse) plus the gate's FP32 and INT8 runs over the evaluation images, and the
  per-layer sensitivity analysis;
- the process's peak resident memory after each network.
"""
from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

BATCH = 32
MODELS = {  # name: (factory, input size, calibration images, evaluation images)
    "digits": ("quantflow.demo.net:build", 32, 200, 359),
    "mbv2": ("quantflow.demo.mbv2:build", 32, 200, 359),
    "resnet18": ("mindcv:resnet18", 224, 256, 1000),
}


def _network(factory: str):
    module, _, name = factory.partition(":")
    if module == "mindcv":
        from benchmarks.zoo import create
        return create(name)
    import importlib
    return getattr(importlib.import_module(module), name)(num_classes=10)


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def _ort_quantize(fp32_onnx: Path, out: Path, batches: list[np.ndarray], input_name: str) -> float:
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(batches)

        def get_next(self):
            x = next(self.it, None)
            return None if x is None else {input_name: x}

    _, seconds = _timed(lambda: quantize_static(str(fp32_onnx), str(out), Reader(), quant_format=QuantFormat.QDQ,
                                                per_channel=True, calibrate_method=CalibrationMethod.MinMax))
    return seconds


ROUNDS, ROUND_SECONDS = 5, 0.5


def _throughputs(runs: dict, images: int) -> dict[str, float]:
    """Images per second of each ``runs[name] = (run, batch)``, fed one batch at a time as the gate does:
    the best of ``ROUNDS`` rounds, each run in a round repeated for at least ``ROUND_SECONDS`` (at most
    ``images`` images), the runs interleaved within each round so that a busy moment on a shared machine
    does not favour one of them."""
    most = max(1, -(-images // BATCH))
    for run, batch in runs.values():
        run(batch)  # warm-up
    best = {name: 0.0 for name in runs}
    for _ in range(ROUNDS):
        for name, (run, batch) in runs.items():
            done, start = 0, time.perf_counter()
            while done < most and (done == 0 or time.perf_counter() - start < ROUND_SECONDS):
                run(batch)
                done += 1
            best[name] = max(best[name], done * BATCH / (time.perf_counter() - start))
    return best


def bench_model(name: str, images: int | None, evals: int | None, workdir: Path) -> dict:
    import onnx
    import onnxruntime as ort

    from quantflow.backends.export import export_mindir
    from benchmarks.zoo import randomize
    from quantflow.engine.runner import Runner, float_runner
    from quantflow.engine.lowering import lower
    from quantflow.engine.int8_emulator import Emulator
    from quantflow.quantization.deploy import quantized_graph
    from quantflow.frontends.mindir import read_mindir
    from quantflow.quantization.calibrater import calibrate
    from quantflow.quantization.passes import fold_for_quantization

    factory, size, n_cal, n_eval = MODELS[name]
    n_cal, n_eval = images or n_cal, evals or n_eval
    mindir = export_mindir(randomize(_network(factory)), (BATCH, 3, size, size), workdir / f"{name}.mindir")
    graph = read_mindir(mindir)
    folded = fold_for_quantization(graph)
    rng = np.random.default_rng(0)
    cal = [rng.normal(size=(min(BATCH, n_cal - s), 3, size, size)).astype(np.float32) for s in range(0, n_cal, BATCH)]
    cal_full = [np.concatenate([c, np.zeros((BATCH - len(c),) + c.shape[1:], np.float32)]) for c in cal]
    x_eval = rng.normal(size=(BATCH, 3, size, size)).astype(np.float32)  # one batch, run n_eval / BATCH times

    row = {"model": name, "input": f"{size}x{size}", "cal_images": n_cal, "eval_images": n_eval}
    qp, row["qf_cal_minmax_s"] = _timed(lambda: calibrate(folded, cal, "minmax"))
    _, row["qf_cal_kl_s"] = _timed(lambda: calibrate(folded, cal, "kl"))
    _, row["qf_cal_mse_s"] = _timed(lambda: calibrate(folded, cal, "mse"))

    fp32_path = workdir / f"{name}_fp32.onnx"
    onnx.save(lower(fold_for_quantization(graph), "float32", input_name="x"), str(fp32_path))
    qdq_path = workdir / f"{name}_qdq.onnx"
    row["ort_cal_s"] = _ort_quantize(fp32_path, qdq_path, cal_full, "x")

    emulator = Emulator(quantized_graph(folded, qp))
    ort_int8 = Runner(onnx.load(str(qdq_path)), "x", BATCH)
    fp32 = float_runner(graph)
    ips = _throughputs({"qf_int8_ips": (emulator.logits, x_eval.astype(np.float16)), "ort_int8_ips": (ort_int8.run, x_eval),
                        "fp32_ips": (fp32.run, x_eval)}, n_eval)
    row.update(ips)
    from quantflow.config import QuantizationSection
    from quantflow.quantization.sensitivity import analyse
    n_sens = QuantizationSection().sensitivity_images
    _, row["sensitivity_s"] = _timed(lambda: analyse(folded, qp, [c[:n_sens] for c in cal[:-(-n_sens // BATCH)]]))
    # what the calibrate and gate stages compute by default: mse calibration, FP32 and INT8 over the
    # evaluation images; and the per-layer analysis (default image count) on top
    row["cal_gate_s"] = row["qf_cal_mse_s"] + n_eval / row["qf_int8_ips"] + n_eval / row["fp32_ips"]
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row["ort_threads"] = ort.SessionOptions().intra_op_num_threads or "default"
    return row


def format_table(rows: list[dict]) -> str:
    head = (f"{'model':<9} {'input':>7} {'cal img':>7} | {'qf minmax s':>11} {'qf kl s':>8} {'qf mse s':>8} {'ort s':>7} "
            f"{'ratio':>6} | {'qf int8 img/s':>13} {'ort int8 img/s':>14} {'ratio':>6} | {'fp32 img/s':>10} "
            f"| {'cal+gate s':>10} {'sensitivity s':>13} | {'peak RSS MB':>11}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['model']:<9} {r['input']:>7} {r['cal_images']:>7} | {r['qf_cal_minmax_s']:>11.2f} "
            f"{r['qf_cal_kl_s']:>8.2f} {r['qf_cal_mse_s']:>8.2f} {r['ort_cal_s']:>7.2f} {r['qf_cal_minmax_s'] / r['ort_cal_s']:>5.2f}x | "
            f"{r['qf_int8_ips']:>13.0f} {r['ort_int8_ips']:>14.0f} {r['qf_int8_ips'] / r['ort_int8_ips']:>5.2f}x | "
            f"{r['fp32_ips']:>10.0f} | {r['cal_gate_s']:>10.1f} {r['sensitivity_s']:>13.1f} | "
            f"{r['peak_rss_mb']:>11.0f}")
    lines.append("ratio: quantflow minmax calibration time / onnxruntime quantize_static time (lower is better); "
                 "quantflow INT8 emulation throughput / onnxruntime INT8 QDQ throughput (higher is better); "
                 "cal+gate: the default (mse) calibration + FP32 and INT8 emulation over the evaluation images "
                 "(image decoding and AIPP not included); sensitivity: the per-layer analysis on the default "
                 "quantization.sensitivity_images calibration images")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--images", type=int, default=None, help="calibration images (default per model)")
    ap.add_argument("--eval", type=int, default=None, help="images for the throughput runs (default per model)")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            rows.append(bench_model(name.strip(), a.images, a.eval, Path(tmp)))
            print(format_table(rows[-1:]).splitlines()[2], flush=True)
    print()
    print(format_table(rows))


if __name__ == "__main__":
    main()
