"""Benchmark: the whole quantflow build against onnxruntime doing the same work, each as a fresh process.

    python -m benchmarks.bench                                   # mbv2, resnet18 (224x224), yolov5n (416x416), digits
    python -m benchmarks.bench --models mbv2 --calib 64 --eval 260 --repeat 3 --json out.json

For each model, ``benchmarks.zoo`` writes a quantflow project (untimed): the network with random weights as
``model.mindir`` (mindcv's MobileNetV2 and ResNet-18 at 224x224, mindyolo's YOLOv5-n / YOLOv8-n at 416x416 gated
on every output, the demo's DigitsNet at 32x32), ``--calib`` calibration and ``--eval`` held-out images (the
digits, resized) and a ``quantflow.toml`` with the build's defaults (``mse`` ranges, 2 verification images,
fallback off, so no per-layer analysis unless the gate fails; one engine worker).  Speed does not depend on the
weights.
Then, ``--repeat`` rounds, each running in turn:

- **quantflow**: ``python -m quantflow.cli build quantflow.toml`` (what ``quantflow build`` runs) into an empty
  output folder: Python start-up and imports, preflight (MindIR read, image checks, AIPP on 4 images), sampling
  (every calibration image decoded and hashed), the graph stage (MindIR read, MindSpore's reference run on the
  verification images, the IR's check, graph.onnx), calibrate (BatchNorm folding, the two calibration passes,
  ``mse`` ranges, the INT8 parameters, histograms), aipp (rendered and verified),
  fallback ("off"), export (deploy.onnx, checked; the deploy MindIR through MindSpore; record.txt), atc
  (skipped: no CANN here), the gate (FP32 and the INT8 emulation through AIPP on every held-out image, the text
  and HTML reports with their plots) and the summary;
- **onnxruntime**, once with Percentile and once with MinMax calibration: ``python -m benchmarks.ort_side``
  (see there) on the build's ``graph.onnx`` and its sampled calibration images: Python start-up and imports,
  the calibration images decoded and preprocessed, ``quant_pre_process`` (onnxruntime's BatchNorm folding and
  shape inference), ``quantize_static`` (QDQ, per-channel), then every held-out image decoded and preprocessed
  once and run through the FP32 and the INT8 model, compared by top-1 (classifiers) or by each output's cosine
  (detectors).

What only quantflow does (and is in its time): the MindSpore reference check, the AIPP config and its
verification, the INT8 emulation of the Ascend arithmetic instead of onnxruntime's own INT8 kernels, the
deploy graphs (ONNX and MindIR), the reports.  What only onnxruntime does: its
pre-processing.  Both sides use the same FP32 graph (batch size included), the same images, onnxruntime's
default thread count, and one process each (quantflow's default ``engine.workers = 1``).

Each run is measured from outside (``benchmarks.measure``): wall and CPU (user + system) seconds, and peak
memory: the resident memory of the process and its children, summed, sampled every 50 ms (or the kernel's
high-water mark of the largest process, where that is higher: a peak between two samples).  The ratios are
quantflow / onnxruntime, computed pair by pair within each round (so a slower moment of a shared machine hits
both sides of a pair) and given as the median (min-max) over the rounds; the per-stage table cuts quantflow's
runs at doit's task lines.  Speeds are reported, never judged.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.measure import measure, stages

ROOT = Path(__file__).resolve().parent.parent
MODELS = {  # name: (zoo architecture, input size, calibration images, held-out images)
    "mbv2": ("mobilenet_v2_100", 224, 64, 260),
    "resnet18": ("resnet18", 224, 64, 260),
    "yolov5n": ("yolov5n", 416, 32, 32),
    "yolov8n": ("yolov8n", 416, 32, 32),
    "digits": ("digits", 32, 64, 260),
}
DEFAULT_MODELS = "mbv2,resnet18,yolov5n,digits"
ORT_METHODS = ("Percentile", "MinMax")


def _env() -> dict:
    """quantflow and benchmarks importable from this checkout, whatever the working folder."""
    return {"PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def write_project(name: str, folder: Path, size: int | None = None, calib: int | None = None,
                  evals: int | None = None) -> Path:
    """The model's quantflow project in ``folder`` (its quantflow.toml)."""
    from benchmarks.zoo import build_project

    arch, default_size, n_cal, n_eval = MODELS[name]
    return build_project(arch, folder, size=size or default_size, calib_images=calib or n_cal,
                         eval_images=evals or n_eval, verify_images=None, data_root=ROOT)


def run_quantflow(toml: Path):
    """``quantflow build`` of the project into an empty output folder, measured."""
    shutil.rmtree(toml.parent / "build", ignore_errors=True)
    run = measure([sys.executable, "-m", "quantflow.cli", "build", toml.name], cwd=toml.parent, env=_env())
    if run.returncode != 0:
        raise RuntimeError(f"quantflow build {toml} failed (exit {run.returncode}):\n{run.output[-4000:]}")
    return run


def run_ort(toml: Path, graph: Path, method: str, out: Path):
    """onnxruntime's side (``benchmarks.ort_side``) with ``method`` calibration, measured; its phases."""
    run = measure([sys.executable, "-m", "benchmarks.ort_side", str(toml), str(graph), "--method", method,
                   "--out", str(out)], cwd=toml.parent, env=_env())
    if run.returncode != 0:
        raise RuntimeError(f"onnxruntime side ({method}) failed (exit {run.returncode}):\n{run.output[-4000:]}")
    return run, json.loads(run.lines[-1][1])


def _figures(run) -> dict:
    """Wall and CPU seconds; peak memory: the sampled peak of the tree's sum, or the high-water mark of its largest
    process where that is higher (a peak between two samples)."""
    return {"wall_s": run.wall_s, "cpu_s": run.user_s + run.sys_s,
            "peak_mb": max(run.tree_rss_mb or 0.0, run.max_rss_mb or 0.0), "max_rss_mb": run.max_rss_mb,
            "tree_rss_mb": run.tree_rss_mb}


def bench_model(name: str, workdir: Path, size: int | None = None, calib: int | None = None,
                evals: int | None = None, repeat: int = 1, log=print) -> dict:
    """Every run of one model: {"quantflow": [figures + stages], "ort": {method: [figures + phases]}, ...}."""
    toml = write_project(name, workdir / name, size, calib, evals)
    row = {"model": name, "arch": MODELS[name][0], "quantflow": [], "ort": {m: [] for m in ORT_METHODS}}
    for r in range(repeat):
        qf = run_quantflow(toml)
        latest = json.loads((toml.parent / "build" / "latest.json").read_text())
        row["quantflow"].append({**_figures(qf), "stages": stages(qf)})
        log(f"{name} round {r + 1}/{repeat}: quantflow build {qf.wall_s:.1f} s, peak {_figures(qf)['peak_mb']:.0f} MB")
        graph = workdir / f"{name}.graph.onnx"
        shutil.copyfile(latest["graph_onnx"], graph)
        for method in ORT_METHODS:
            run, result = run_ort(toml, graph, method, workdir / f"{name}.{method}.onnx")
            row["ort"][method].append({**_figures(run), **result})
            log(f"{name} round {r + 1}/{repeat}: onnxruntime {method} {run.wall_s:.1f} s, "
                f"peak {_figures(run)['peak_mb']:.0f} MB")
    manifest = json.loads((toml.parent / "build" / "calibration" / "manifest.json").read_text())
    row.update(input=_input_size(toml), calib_images=len(manifest["images"]),
               eval_images=row["ort"][ORT_METHODS[0]][0]["images"], gate=latest["gate"])
    return row


def _input_size(toml: Path) -> str:
    import tomllib
    _, _, h, w = tomllib.loads(toml.read_text())["model"]["input_shape"]
    return f"{h}x{w}"


def _stat(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def summary(row: dict) -> dict:
    """Min / median / max of each figure over the rounds, and the pairwise ratios."""
    qf = row["quantflow"]
    out = {"quantflow": {k: _stat([r[k] for r in qf]) for k in ("wall_s", "cpu_s", "peak_mb")}, "ort": {},
           "ratio": {}, "cpu_ratio": {}}
    for m, runs in row["ort"].items():
        out["ort"][m] = {k: _stat([r[k] for r in runs]) for k in ("wall_s", "cpu_s", "peak_mb")}
        out["ratio"][m] = _stat([q["wall_s"] / o["wall_s"] for q, o in zip(qf, runs)])
        out["cpu_ratio"][m] = _stat([q["cpu_s"] / o["cpu_s"] for q, o in zip(qf, runs)])
    names = list(dict.fromkeys(k for r in qf for k in r["stages"]))
    out["stages"] = {k: {"s": _stat([r["stages"].get(k, {"s": 0.0})["s"] for r in qf]),
                         "rss_mb": max(r["stages"].get(k, {"rss_mb": 0.0})["rss_mb"] for r in qf)} for k in names}
    return out


def _mm(t: tuple[float, float, float], fmt: str = ".1f") -> str:
    return f"{t[0]:{fmt}}/{t[1]:{fmt}}"


def format_table(rows: list[dict]) -> str:
    """One line per model: times (min/median s), the pairwise ratios (median, min-max), peak memory (MB)."""
    head = (f"{'model':<9} {'input':>7} {'cal':>4} {'eval':>4} | {'quantflow s':>11} {'ort Pct s':>10} "
            f"{'ort MinMax s':>12} | {'qf/ort Pct':>16} {'qf/ort MinMax':>16} | {'qf MB':>6} {'Pct MB':>6} "
            f"{'MinMax MB':>9} | {'qf CPU s':>8} {'CPU/Pct':>7}")
    lines = [head, "-" * len(head)]
    for row in rows:
        s = summary(row)
        q, o = s["quantflow"], s["ort"]

        def ratio(m):
            r = s["ratio"][m]
            return f"{r[1]:.2f}x ({r[0]:.2f}-{r[2]:.2f})"
        lines.append(
            f"{row['model']:<9} {row['input']:>7} {row['calib_images']:>4} {row['eval_images']:>4} | "
            f"{_mm(q['wall_s']):>11} {_mm(o['Percentile']['wall_s']):>10} {_mm(o['MinMax']['wall_s']):>12} | "
            f"{ratio('Percentile'):>16} {ratio('MinMax'):>16} | {q['peak_mb'][1]:>6.0f} "
            f"{o['Percentile']['peak_mb'][1]:>6.0f} {o['MinMax']['peak_mb'][1]:>9.0f} | "
            f"{q['cpu_s'][1]:>8.1f} {s['cpu_ratio']['Percentile'][1]:>6.2f}x")
    n = max(len(r["quantflow"]) for r in rows)
    lines.append(f"times: min/median over {n} round(s), each a fresh process; ratios: quantflow / onnxruntime pair by "
                 f"pair within a round, median (min-max); MB: peak resident memory of the process tree (median); "
                 f"CPU: user + system seconds (median), CPU/Pct their ratio against onnxruntime Percentile")
    return "\n".join(lines)


def format_stages(rows: list[dict]) -> str:
    """quantflow's build cut at doit's task lines (median seconds / peak MB of each stage), and onnxruntime's
    phases (median seconds)."""
    lines = ["quantflow build per stage (median s / peak MB); onnxruntime per phase (median s):"]
    for row in rows:
        st = summary(row)["stages"]
        lines.append(f"{row['model']} ({row['input']}) quantflow: " + ", ".join(
            f"{k} {v['s'][1]:.1f}/{v['rss_mb']:.0f}" for k, v in st.items() if v["s"][1] >= 0.05))
        for m, runs in row["ort"].items():
            phases = list(runs[0]["phases"])
            lines.append(f"{row['model']} ({row['input']}) onnxruntime {m}: " + ", ".join(
                f"{k} {statistics.median(r['phases'][k] for r in runs):.1f}" for k in phases))
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--calib", type=int, default=None, help="calibration images (default per model: 64, detectors 32)")
    ap.add_argument("--eval", type=int, default=None, help="held-out images (default per model: 260, detectors 32)")
    ap.add_argument("--size", type=int, default=None, help="input height and width (default per model)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (each: quantflow, ort Percentile, ort MinMax)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the projects and models here (default: a "
                                                               "temporary folder)")
    ap.add_argument("--json", type=Path, default=None, help="write every run's figures here")
    ap.add_argument("--report", type=Path, default=None, help="print the tables of a --json file, running nothing")
    a = ap.parse_args(argv)
    if a.report:
        rows = json.loads(a.report.read_text())
        print(format_table(rows))
        print()
        print(format_stages(rows))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = a.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in a.models.split(","):
            rows.append(bench_model(name.strip(), workdir, a.size, a.calib, a.eval, a.repeat,
                                    log=lambda text: print(text, file=sys.stderr, flush=True)))
            if a.json:
                a.json.write_text(json.dumps(rows, indent=1))
    print(format_table(rows))
    print()
    print(format_stages(rows))


if __name__ == "__main__":
    main()
