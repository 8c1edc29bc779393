"""calibrate: BatchNorm folded; observers on the input of every quantized op, two passes over the calibration
images (ranges, then histograms); the Ascend INT8 parameters (``qparams``, bias-corrected if asked: that runs the
per-layer analysis's one-op runs here); the observers' histograms.  The per-layer analysis itself is the
``sensitivity`` stage's."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from quantflow.engine import shard
from quantflow.errors import ConfigError
from quantflow.io.atomic import save_npz, write_text
from quantflow.quantization.qparams import QPARAMS_JSON, QPARAMS_NPZ

from .inputs import image_batches, read_graph
from .stage import Stage

CALIBRATION_TXT, HISTOGRAMS_NPZ = "calibration.txt", "histograms.npz"


def _check_patterns(nodes, cfg) -> None:
    from quantflow.quantization.selection import unmatched

    q = cfg.quantization
    for field, patterns in (("quantization.skip", q.skip), ("quantization.methods", list(q.methods))):
        bad = unmatched(nodes, patterns)
        if bad:
            names = ", ".join(n.label for n in nodes[:6]) + (", ..." if len(nodes) > 6 else "")
            raise ConfigError(f"{field}: pattern(s) {', '.join(map(repr, bad))} name no quantizable op (node name, "
                              f"layer scope glob or op type; the quantizable ops are: {names})")


def calibrate_stage(cfg, kdir: Path, calibration_paths: list[Path], graph_dir: Path):
    """Ranges and INT8 parameters (``qparams``; with ``quantization.bias_correction`` the biases corrected by the
    mean output shift each op alone in INT8 shows on the first ``quantization.sensitivity_images`` images; with
    ``quantization.channel_scale`` the convolutions' inputs scaled per channel) and the observers' histograms."""
    from quantflow.quantization.calibrater import calibrate_with, quantizable_nodes
    from quantflow.quantization.passes import fold_for_quantization
    from quantflow.quantization.sensitivity import analyse, correct_bias

    k, q = cfg.calibration, cfg.quantization
    graph = fold_for_quantization(read_graph(cfg, graph_dir))
    _check_patterns(quantizable_nodes(graph), cfg)
    batches = image_batches(cfg, calibration_paths, k.batch_size)
    qp, cal = calibrate_with(graph, batches, k.method, k.percentile, k.histogram_bins, k.kl_max_clipped, q.skip,
                             q.methods, channel_scale=q.channel_scale)
    if not qp.ops:
        print(f"calibrate: no op left in INT8 ({len(qp.float16)} quantizable op(s) in float16): a float16-only "
              f"build, gated like any other")
    if q.bias_correction and qp.ops:
        sample = image_batches(cfg, calibration_paths[:q.sensitivity_images], k.batch_size)
        print(f"bias correction: {len(qp.ops)} ops, each alone in INT8, {shard.where(cfg.engine)}")
        qp = correct_bias(qp, analyse(qp.apply(graph), qp, sample, bias_shift=True, engine=cfg.engine).bias_shift)
    qp.save(kdir)
    save_npz(kdir / HISTOGRAMS_NPZ, {f"{i}.{name}": v for i, op in enumerate(qp.ops)
                                     for name, v in _histogram(cal.observers[op.input]).items()})
    table = qp.table()
    if qp.channel_scales:
        short = {q.node: q.scope for q in qp.ops}
        table += (f"\ninput scaled per channel before its AscendQuant (quantization.channel_scale, "
                  f"{len(qp.channel_scales)}): " + ", ".join(short.get(n, n) for n in qp.channel_scales))
    if qp.float16:
        table += f"\nleft in float16 on the device ({len(qp.float16)}):\n{qp.float16_table()}"
    write_text(Path(kdir, CALIBRATION_TXT),
               f"method {k.method}, {len(batches)} images, {len(qp.ops)} INT8 ops\n{table}\n")
    return qp, len(batches), table


def _histogram(obs) -> dict:
    if obs.hist_signed is None:  # minmax collects no histograms
        return {}
    return {"hist": obs.hist_signed, "range": np.array([obs.lo, obs.hi])}


def load_histograms(calibrate_dir: Path, qp) -> dict:
    """node -> {"scope", "hist", "lo", "hi", "clip"} for the ops whose input histogram was collected."""
    path = Path(calibrate_dir) / HISTOGRAMS_NPZ
    arrays = np.load(path) if path.is_file() else {}
    out = {}
    for i, op in enumerate(qp.ops):
        if f"{i}.hist" in arrays:
            lo, hi = (float(v) for v in arrays[f"{i}.range"])
            out[op.node] = {"scope": op.scope, "hist": arrays[f"{i}.hist"], "lo": lo, "hi": hi,
                            "clip": (op.stats["lo"], op.stats["hi"])}
    return out


def _run(b) -> None:
    kdir = b.dir("calibrate")
    qp, images, table = calibrate_stage(b.cfg, kdir, b.calibration_paths(), b.dir("graph"))
    print(f"calibrated {len(qp.ops)} INT8 ops with {qp.method} on {images} images -> {kdir / QPARAMS_JSON}\n{table}")


def _key_inputs(b) -> dict:
    c = b.cfg.model_dump(mode="json")
    q = c["quantization"]
    # what decides the parameters: not when the analysis runs; without bias correction, not its images, nor how
    # the images are batched (the observers' ranges and histograms are the same for any batching)
    corrected = q["bias_correction"]
    unused = ("fallback", "max_fallback", "sensitivity", "recover", "recovery_images", "recovery_iterations") + (
        () if corrected else ("sensitivity_images",))
    return {"calibration": {k: v for k, v in c["calibration"].items() if corrected or k != "batch_size"},
            "manifest": b.manifest_digest(), "normalization": c["normalization"],
            "quantization": {k: v for k, v in q.items() if k not in unused}}


STAGE = Stage(
    name="calibrate", doc="observers on every quantized op's input, activation ranges, Ascend INT8 parameters",
    run=_run, needs=("sample", "graph"), key_inputs=_key_inputs,
    outputs=(QPARAMS_JSON, QPARAMS_NPZ, CALIBRATION_TXT, HISTOGRAMS_NPZ))
