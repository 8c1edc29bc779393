"""onnxruntime's side of the benchmark: the work of a quantflow build done with onnxruntime's own quantization, as
one process (``python -m benchmarks.ort_side``), so that it is timed as a whole like ``quantflow build`` is.

    python -m benchmarks.ort_side PROJECT/quantflow.toml graph.onnx --method Percentile --out qdq.onnx

What it does, in order (each phase's seconds are printed as the last line, JSON):

- ``calib``: decodes the calibration images the build sampled (the paths in the build's calibration manifest,
  ``<output_dir>/calibration/manifest.json``) with OpenCV and applies the project's training preprocessing
  (``[normalization]``: scale, mean/std, channel order), in batches of the graph's batch size;
- ``prepare``: ``onnxruntime.quantization.quant_pre_process`` on the FP32 graph (shape inference and
  onnxruntime's graph optimizations, which fold BatchNorm into the convolutions: the step onnxruntime's
  quantization guide asks for, and the counterpart of quantflow's BatchNorm folding);
- ``quantize``: ``onnxruntime.quantization.quantize_static`` on that graph (QDQ, per-channel weights, its
  default int8 activations and weights, ``--method`` MinMax / Percentile / Entropy calibration over those
  batches), writing the INT8 QDQ model (with ``QDQDisableWeightAdjustForInt32Bias``: onnxruntime 1.32's
  adjustment fails on the Gemm its own pre-processing writes; it only rescales weights whose bias would overflow
  int32, and costs nothing measurable);
- ``evaluate``: every image of ``evaluation.data_dir`` (sorted, sub-folders included) decoded once and
  preprocessed, then run through the FP32 graph and the INT8 QDQ model in onnxruntime, and compared as the
  build's gate compares: top-1 of each against the class folders (``evaluation.metric = "top1"``) or every
  output's cosine similarity of INT8 to FP32 (``"outputs"``).

It imports neither quantflow nor MindSpore: what an onnxruntime user runs, from the same files.  ``--threads N``
(for diagnosis) gives every onnxruntime session, quantize_static's own included, N threads.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from pathlib import Path

import numpy as np

EXTS = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".ppm", ".pgm", ".webp"}


class Project:
    """What the ort side reads from a quantflow project's configuration."""

    def __init__(self, toml: Path):
        self.root = Path(toml).resolve().parent
        c = tomllib.loads(Path(toml).read_text())
        self.shape = c["model"]["input_shape"]
        n = c["normalization"]
        self.mean, self.std = np.float32(n["mean"]), np.float32(n["std"])
        self.scale, self.order = n["scale"], n["channel_order"]
        self.metric = c["evaluation"].get("metric", "top1")
        self.eval_dir = self.root / c["evaluation"]["data_dir"]
        self.out = self.root / c.get("build", {}).get("output_dir", "build")

    def calibration_paths(self) -> list[Path]:
        manifest = json.loads((self.out / "calibration" / "manifest.json").read_text())
        return [p if p.is_absolute() else self.root / p for p in (Path(i["path"]) for i in manifest["images"])]

    def evaluation_paths(self) -> list[Path]:
        return sorted(p for p in self.eval_dir.rglob("*") if p.is_file() and p.suffix.lower() in EXTS)

    def load(self, paths) -> np.ndarray:
        """Decoded (OpenCV) and preprocessed: float32 N,C,H,W."""
        import cv2

        c = self.shape[1]
        imgs = np.stack([cv2.imread(str(p), cv2.IMREAD_GRAYSCALE if c == 1 else cv2.IMREAD_COLOR) for p in paths])
        x = imgs[..., None] if imgs.ndim == 3 else imgs
        x = x.astype(np.float32)
        if self.order == "RGB":
            x = x[..., ::-1]
        if self.scale == "0-1":
            x = x / np.float32(255.0)
        return np.ascontiguousarray(((x - self.mean) / self.std).transpose(0, 3, 1, 2))


def _chunks(x: np.ndarray, batch: int):
    """``x`` in pieces of the graph's static batch size (the last one padded), with each piece's real length."""
    for s in range(0, len(x), batch):
        part = x[s:s + batch]
        real = len(part)
        if real < batch:
            part = np.concatenate([part, np.zeros((batch - real,) + part.shape[1:], part.dtype)])
        yield part, real


def quantize(graph: Path, out: Path, method: str, batches: list[np.ndarray]) -> None:
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, quantize_static

    name = onnx.load(str(graph), load_external_data=False).graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(batches)

        def get_next(self):
            x = next(self.it, None)
            return None if x is None else {name: x}

    # QDQDisableWeightAdjustForInt32Bias: onnxruntime 1.32 fails in that adjustment on the Gemm its own
    # pre-processing writes for a Dense layer (a (1, n) bias: "truth value of an array ... is ambiguous")
    quantize_static(str(graph), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    calibrate_method=getattr(CalibrationMethod, method),
                    extra_options={"QDQDisableWeightAdjustForInt32Bias": True})


def evaluate(p: Project, graph: Path, int8: Path, batch_images: int = 64) -> dict:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    fp32 = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
    q = ort.InferenceSession(str(int8), opts, providers=["CPUExecutionProvider"])
    name, batch = fp32.get_inputs()[0].name, fp32.get_inputs()[0].shape[0]
    batch = batch if isinstance(batch, int) else 1
    paths = p.evaluation_paths()
    n_out = len(fp32.get_outputs())
    sums = np.zeros((n_out, 4))   # per output: sum f*d, f*f, d*d, (f-d)^2
    top1 = {"fp32": [], "int8": []}
    for s in range(0, len(paths), batch_images):
        x = p.load(paths[s:s + batch_images])
        for part, real in _chunks(x, batch):
            f_outs = [o[:real] for o in fp32.run(None, {name: part})]
            d_outs = [o[:real] for o in q.run(None, {name: part})]
            for k, (f, d) in enumerate(zip(f_outs, d_outs)):
                f, d = f.astype(np.float64).ravel(), d.astype(np.float64).ravel()
                sums[k] += (f @ d, f @ f, d @ d, (f - d) @ (f - d))
            top1["fp32"].append(f_outs[0].reshape(real, -1).argmax(1))
            top1["int8"].append(d_outs[0].reshape(real, -1).argmax(1))
    cosine = [float(dot / np.sqrt(ff * dd)) if ff * dd > 0 else 1.0 for dot, ff, dd, _ in sums]
    out = {"images": len(paths), "least_cosine": min(cosine)}
    if p.metric == "top1":
        labels = np.array([int(pp.parent.name) if pp.parent.name.isdigit() else -1 for pp in paths])
        f, d = np.concatenate(top1["fp32"]), np.concatenate(top1["int8"])
        out.update(fp32_top1=float((f == labels).mean()), int8_top1=float((d == labels).mean()),
                   top1_agreement=float((f == d).mean()))
    return out


def _threads(ort, n: int) -> None:
    """Every session onnxruntime creates from here on (quantize_static's own included) with ``n`` threads."""
    base = ort.SessionOptions

    class Options(base):
        def __init__(self):
            super().__init__()
            self.intra_op_num_threads = n
    ort.SessionOptions = Options


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path, help="the quantflow project's quantflow.toml (built once: its manifest)")
    ap.add_argument("graph", type=Path, help="the FP32 ONNX graph (the build's graph.onnx)")
    ap.add_argument("--method", default="Percentile", choices=["MinMax", "Percentile", "Entropy"])
    ap.add_argument("--out", type=Path, required=True, help="the INT8 QDQ model to write")
    ap.add_argument("--threads", type=int, default=None, help="onnxruntime threads per session, its calibration "
                                                              "sessions included (default: onnxruntime's)")
    a = ap.parse_args(argv)
    p, phases = Project(a.config), {}
    t = time.perf_counter()
    import onnxruntime  # (its import, as the build's imports, is part of the time)
    if a.threads:
        _threads(onnxruntime, a.threads)
    phases["import"] = time.perf_counter() - t
    t = time.perf_counter()
    import onnx
    dims = onnx.load(str(a.graph), load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    batch = dims[0].dim_value or 1
    cal = [part for part, _ in _chunks(p.load(p.calibration_paths()), batch)]
    phases["calib"] = time.perf_counter() - t
    t = time.perf_counter()
    from onnxruntime.quantization.shape_inference import quant_pre_process
    prepared = a.out.with_name(a.out.stem + ".prepared.onnx")
    quant_pre_process(str(a.graph), str(prepared))
    phases["prepare"] = time.perf_counter() - t
    t = time.perf_counter()
    quantize(prepared, a.out, a.method, cal)
    phases["quantize"] = time.perf_counter() - t
    del cal
    t = time.perf_counter()
    result = evaluate(p, a.graph, a.out)
    phases["evaluate"] = time.perf_counter() - t
    print(json.dumps({"method": a.method, "phases": phases, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
