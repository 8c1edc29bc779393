"""The stage logic behind the doit tasks; each takes the configuration, its own artifact folder and
the folders of the stages it reads from.

    graph      the network (MindIR exported from model.entry + model.checkpoint, model.mindir, or
               model.onnx) -> graph IR, whose float output is checked against the source runtime's
               (MindSpore, or onnxruntime on the ONNX file) on calibration images
    calibrate  observers on every quantized op's input; Ascend INT8 parameters -> qparams; per-layer
               error analysis -> sensitivity
    fallback   the INT8 parameters used: as calibrated, or with the most sensitive ops in float16
    export     the INT8 deploy graphs; the FP32 network (AIR when MindSpore's Ascend backend is available)
    aipp       AIPP config, verified against the training preprocessing
    atc        .om conversion when a CANN toolkit is present
    gate       INT8 emulation (from the uint8 image through AIPP) vs FP32, on held-out images
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..engine import shard
from ..errors import AccuracyGateError, AtcError, ConfigError, UnsupportedNetworkError
from ..images import ImageBatches
from .atomic import PARTIAL, copy_file, save_npz, save_onnx, write_json, write_text  # every artifact appears whole


def load_graph(cfg, graph_dir: Path):
    from ..frontends.source import read_model
    return read_model(cfg, graph_dir)


# ----------------------------------------------------------------------------- graph

def verify_graph(graph, x: np.ndarray, reference: np.ndarray, where, tolerance: float,
                 runtime: str = "MindSpore") -> dict:
    """Compare the IR's float output (onnxruntime) on ``x`` with ``reference``, the source runtime's
    output of the same network (``runtime`` names it); raise when beyond tolerance."""
    from ..engine.float_runner import float_runner

    got = float_runner(graph).run(x)[graph.outputs[0]]
    ref = np.asarray(reference, np.float32)
    if got.shape != ref.shape:
        raise UnsupportedNetworkError(f"{where}: the graph IR gives output shape {got.shape}, {runtime} {ref.shape}")
    scale = max(float(np.abs(ref).max()), 1e-6)
    err = float(np.abs(got - ref).max())
    report = {"images": int(len(x)), "max_abs_diff": err, "reference_max_abs": scale, "reference": runtime,
              "relative_diff": err / scale, "tolerance": tolerance,
              "top1_agreement": float((got.reshape(len(x), -1).argmax(1) == ref.reshape(len(x), -1).argmax(1)).mean())}
    if err / scale > tolerance:
        raise UnsupportedNetworkError(
            f"{where}: the graph IR does not compute what {runtime} computes: largest |diff| {err:.3g} on outputs "
            f"up to {scale:.3g} (relative {err / scale:.2e} > model.verify_tolerance {tolerance:g}) over {len(x)} "
            f"calibration images")
    return report


def graph_stage(cfg, kdir: Path, calibration_paths: list[Path]) -> dict:
    from ..backends.export import export_mindir
    from ..engine.float_runner import to_onnx
    from ..frontends.source import check_given_file, model_file, reference_outputs, source_field
    from ..model import build_network

    kdir = Path(kdir)
    check_given_file(cfg)
    if cfg.model.entry:
        export_mindir(build_network(cfg), cfg.model.input_shape, kdir / "model.mindir")
        source = f"exported from {cfg.model.entry} + {cfg.path(cfg.model.checkpoint)}"
    else:
        source = f"{source_field(cfg)} {model_file(cfg, kdir)}"
    path = model_file(cfg, kdir)
    graph = load_graph(cfg, kdir)
    shape = graph.tensors[graph.inputs[0]].shape
    if tuple(shape) != tuple(cfg.model.input_shape):
        raise UnsupportedNetworkError(f"{path}: the network input is {list(shape)}, model.input_shape says "
                                      f"{list(cfg.model.input_shape)}")
    n = cfg.model.verify_images
    x = next(iter(ImageBatches.for_config(cfg, calibration_paths[:n], n)))
    reference = reference_outputs(cfg, kdir, x, shape[0])
    check = verify_graph(graph, x, reference, path, cfg.model.verify_tolerance,
                         "onnxruntime (the ONNX file as given)" if cfg.model.onnx else "MindSpore")
    save_onnx(to_onnx(graph, input_name=cfg.model.input_name), kdir / "graph.onnx")
    from ..ops import get as get_op
    from ..quantization.passes import fold_for_quantization
    approximate = sorted(op for op in fold_for_quantization(graph).op_counts() if not get_op(op).exact_in_fp16)
    info = {"source": source, "model_file": str(path), "nodes": len(graph.nodes), "ops": graph.op_counts(),
            "parameters": int(sum(v.size for v in graph.initializers.values())), "verify": check,
            "float16_assumed_ops": approximate}
    write_json(kdir / "graph.json", info)
    return info


# ----------------------------------------------------------------------------- calibrate

def _check_patterns(nodes, cfg) -> None:
    from ..quantization.selection import unmatched

    q = cfg.quantization
    for field, patterns in (("quantization.skip", q.skip), ("quantization.methods", list(q.methods))):
        bad = unmatched(nodes, patterns)
        if bad:
            names = ", ".join(n.label for n in nodes[:6]) + (", ..." if len(nodes) > 6 else "")
            raise ConfigError(f"{field}: pattern(s) {', '.join(map(repr, bad))} name no quantizable op (node name, "
                              f"layer scope glob or op type; the quantizable ops are: {names})")


def calibrate_stage(cfg, kdir: Path, calibration_paths: list[Path], graph_dir: Path):
    """Ranges and INT8 parameters (``qparams``), the observers' histograms, and the per-layer error
    analysis (``sensitivity.json``; with ``quantization.bias_correction`` the biases are corrected by it
    first)."""
    from ..quantization.calibrater import calibrate_with, quantizable_nodes
    from ..quantization.passes import fold_for_quantization
    from ..quantization.sensitivity import analyse, correct_bias

    k, q = cfg.calibration, cfg.quantization
    graph = fold_for_quantization(load_graph(cfg, graph_dir))
    _check_patterns(quantizable_nodes(graph), cfg)
    batches = ImageBatches.for_config(cfg, calibration_paths, k.batch_size)
    qp, cal = calibrate_with(graph, batches, k.method, k.percentile, k.histogram_bins, k.kl_max_clipped, q.skip,
                             q.methods)
    if not qp.ops:
        raise UnsupportedNetworkError(f"{model_file(cfg, graph_dir)}: no Conv2D or MatMul with constant weights is "
                                      f"left to quantize (quantization.skip: {list(q.skip)})")
    sample = ImageBatches.for_config(cfg, calibration_paths[:q.sensitivity_images], k.batch_size)
    if q.bias_correction:
        qp = correct_bias(qp, analyse(graph, qp, sample, bias_shift=True, engine=cfg.engine).bias_shift)
    print(f"per-layer analysis: {len(qp.ops)} ops, {shard.where(cfg.engine)}")
    sensitivity = analyse(graph, qp, sample, engine=cfg.engine)
    qp.save(kdir)
    write_json(kdir / "sensitivity.json", sensitivity.as_dict())
    save_npz(kdir / "histograms.npz", {f"{i}.{name}": v for i, op in enumerate(qp.ops)
                                       for name, v in _histogram(cal.observers[op.input]).items()})
    table = qp.table()
    write_text(Path(kdir, "calibration.txt"),
        f"method {k.method}, {len(batches)} images, {len(qp.ops)} quantized ops\n{table}\n\n"
        f"per-layer sensitivity on {sensitivity.images} calibration images (most sensitive first)\n"
        f"{sensitivity.table()}\n")
    return qp, len(batches), table + "\nmost sensitive layers:\n" + sensitivity.table(5)


def _histogram(obs) -> dict:
    if obs.hist_signed is None:  # minmax collects no histograms
        return {}
    return {"hist": obs.hist_signed, "range": np.array([obs.lo, obs.hi])}


def load_histograms(calibrate_dir: Path, qp) -> dict:
    """node -> {"scope", "hist", "lo", "hi", "clip"} for the ops whose input histogram was collected."""
    path = Path(calibrate_dir) / "histograms.npz"
    arrays = np.load(path) if path.is_file() else {}
    out = {}
    for i, op in enumerate(qp.ops):
        if f"{i}.hist" in arrays:
            lo, hi = (float(v) for v in arrays[f"{i}.range"])
            out[op.node] = {"scope": op.scope, "hist": arrays[f"{i}.hist"], "lo": lo, "hi": hi,
                            "clip": (op.stats["lo"], op.stats["hi"])}
    return out


# ----------------------------------------------------------------------------- fallback

def fallback_stage(cfg, kdir: Path, calibrate_dir: Path, graph_dir: Path, aipp_dir: Path) -> dict:
    """The INT8 parameters the build uses: the calibrated ones (``quantization.fallback = "off"``) or, with
    "auto", those left once the most sensitive ops were rolled back to float16 until the gate's check
    passes on the held-out images (or ``max_fallback`` ops are in float); each next op the most sensitive
    on what the last check failed (the outputs gate: the outputs below the limit)."""
    from ..quantization.fallback import roll_back
    from ..quantization.qparams import QuantParams
    from ..quantization.sensitivity import rank

    kdir, q = Path(kdir), cfg.quantization
    qp = QuantParams.load(calibrate_dir)
    if q.fallback == "off":
        result = {"mode": "off", "steps": [], "float_ops": []}
    else:
        from ..backends.aipp import parse
        from ..quantization.passes import fold_for_quantization
        from .gate import eval_items
        from .metrics import metric

        print(f"fallback: accuracy checks on {len(eval_items(cfg)[0])} held-out images {shard.where(cfg.engine)}")
        graph = load_graph(cfg, graph_dir)
        aipp_cfg = Path(aipp_dir) / "aipp.cfg"
        m = metric(cfg.evaluation.metric)
        check = m.checker(cfg, graph, fold_for_quantization(graph), parse(aipp_cfg.read_text(), str(aipp_cfg)))
        sensitivity = json.loads((Path(calibrate_dir) / "sensitivity.json").read_text())
        qp, steps = roll_back(qp, sensitivity["ranking"], check, q.max_fallback, m.step_keys,
                              rerank=lambda report: rank(sensitivity["ops"], m.focus(report)))
        result = {"mode": "auto", "metric": m.name, "max_fallback": q.max_fallback, "steps": steps,
                  "float_ops": steps[-1]["float_ops"], "passed": steps[-1]["passed"]}
        for i, st in enumerate(steps):
            names = ", ".join(f["scope"] for f in st["float_ops"]) or "none"
            print(f"fallback step {i}: {st['int8_ops']} INT8 ops, {m.step_line(st)} "
                  f"{'PASS' if st['passed'] else 'fail'}; in float16: {names}")
    qp.save(kdir)
    write_json(kdir / "fallback.json", result)
    return result


# ----------------------------------------------------------------------------- export

def export_stage(cfg, kdir: Path, graph_dir: Path, qparams_dir: Path) -> dict:
    """FP32: MindIR (and AIR where possible), plus the graph stage's FP32 ONNX.  INT8: the Ascend deploy
    graph as ONNX (checked by onnx.checker and shape inference) and as a MindSpore network (MindIR,
    and AIR where possible), and AMCT's record file."""
    from ..backends.deploy_mindspore import export_deploy_mindir
    from ..backends.deploy_onnx import check_deploy, deploy_model, record_text
    from ..backends.export import export_air
    from ..quantization.deploy import quantized_graph
    from ..quantization.passes import fold_for_quantization
    from ..quantization.qparams import QuantParams

    from ..frontends.source import model_file

    kdir = Path(kdir)
    # everything atc may read, in one place
    source = "model.onnx" if cfg.model.onnx else "model.mindir"
    copy_file(model_file(cfg, graph_dir), kdir / source)
    copy_file(Path(graph_dir) / "graph.onnx", kdir / "graph.onnx")
    if cfg.model.entry:
        from ..model import build_network
        status = {"mindir": "model.mindir", **export_air(build_network(cfg), cfg.model.input_shape, kdir, "model")}
    else:
        status = {"mindir": None if cfg.model.onnx else "model.mindir", "air": None,
                  "air_skipped": f"{source} was given without model.entry: AIR is exported from the network"}
    status["model_file"] = source
    graph = fold_for_quantization(load_graph(cfg, graph_dir))
    qp = QuantParams.load(qparams_dir)
    deploy = deploy_model(graph, qp, cfg.model.input_name)
    check_deploy(deploy)
    save_onnx(deploy, kdir / "deploy.onnx")
    write_text(kdir / "record.txt", record_text(graph, qp))
    status.update(export_deploy_mindir(quantized_graph(graph, qp), kdir))
    status.update(fp32_onnx="graph.onnx", deploy_onnx="deploy.onnx", record="record.txt",
                  int8_ops=len(qp.ops), input_name=cfg.model.input_name)
    write_json(kdir / "export.json", status)
    return status


def atc_model(cfg, export: dict) -> tuple[str, int]:
    """(model file, atc --framework) for build.atc_model: an AIR where one exists, else the ONNX."""
    if cfg.build.atc_model == "fp32":
        return (export["air"], 1) if export.get("air") else (export["fp32_onnx"], 5)
    return (export["deploy_air"], 1) if export.get("deploy_air") else (export["deploy_onnx"], 5)


# ----------------------------------------------------------------------------- atc

def atc_stage(cfg, kdir: Path, export_dir: Path, aipp_dir: Path) -> dict:
    from ..backends.atc import atc_command, find_atc, not_found_reason, run_atc

    kdir, export_dir = Path(kdir), Path(export_dir)
    export = json.loads((export_dir / "export.json").read_text())
    atc = find_atc()
    status = {"atc": str(atc) if atc else None, "soc_version": cfg.build.soc_version, "model": cfg.build.atc_model,
              "om": None, "command": None}
    model, framework = atc_model(cfg, export)
    status.update(input=model, framework=framework)
    if atc is None:
        status.update(status="skipped", reason=not_found_reason())
    else:
        # atc writes into a scratch folder (a fixed name: the command is recorded in atc.json, and one build
        # runs per folder at a time); the finished .om is renamed into place
        scratch = kdir / f".atc{PARTIAL}d"
        shutil.rmtree(scratch, ignore_errors=True)
        cmd = atc_command(atc, export_dir / model, framework, scratch / "model", cfg.build.soc_version,
                          Path(aipp_dir) / "aipp.cfg", cfg.build.precision_mode, cfg.model.input_name,
                          cfg.model.input_shape, cfg.build.atc_args)
        status["command"] = cmd
        print("running: " + " ".join(cmd))
        try:
            result = run_atc(cmd, scratch / "model", cfg.build.atc_timeout_s)
            os.replace(scratch / result["om"], kdir / result["om"])
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        status.update(status="built", om=result["om"], reason=None)
        write_text(kdir / "atc.log", result["log"] + "\n")
    write_json(kdir / "atc.json", status)
    if status["status"] == "skipped":
        msg = f"SKIPPED atc conversion for {cfg.build.soc_version}: {status['reason']}; no .om was written"
        if cfg.build.require_om:
            raise AtcError(msg + " (build.require_om = true)")
        print(msg)
    else:
        print(f"built offline model {kdir / status['om']} for {cfg.build.soc_version}")
    return status


# ----------------------------------------------------------------------------- gate

def gate_stage(cfg, kdir: Path, graph_dir: Path, calibrate_dir: Path, fallback_dir: Path, aipp_dir: Path) -> dict:
    """The accuracy verdict on the final INT8 parameters, the accuracy report and the HTML build report
    (written before a failure is raised, so a failing build has its report too)."""
    from ..backends.aipp import parse
    from ..quantization.passes import fold_for_quantization
    from ..quantization.qparams import QuantParams
    from ..report import html
    from .gate import eval_items, evaluate, format_table, write_report
    from .metrics import metric

    kdir, aipp_cfg = Path(kdir), Path(aipp_dir) / "aipp.cfg"
    graph = load_graph(cfg, graph_dir)
    aipp_params = parse(aipp_cfg.read_text(), str(aipp_cfg))
    qp = QuantParams.load(fallback_dir)
    print(f"gate: FP32 and INT8 on {len(eval_items(cfg)[0])} held-out images {shard.where(cfg.engine)}")
    report = evaluate(cfg, graph, fold_for_quantization(graph), qp, aipp_params)
    write_report(report, kdir / "accuracy_report.json", kdir / "accuracy_report.txt")
    sensitivity = json.loads((Path(calibrate_dir) / "sensitivity.json").read_text())
    fallback = json.loads((Path(fallback_dir) / "fallback.json").read_text())
    html.write(kdir / "report.html", f"quantflow build report: {cfg.model.entry or cfg.model.mindir or cfg.model.onnx}", report,
               sensitivity, load_histograms(calibrate_dir, QuantParams.load(calibrate_dir)), fallback)
    print(format_table(report))
    print(f"build report: {kdir / 'report.html'}")
    failure = metric(report).failure(report)
    if failure:
        raise AccuracyGateError(f"{failure}{_advice(sensitivity, qp, cfg)} (report: {kdir / 'report.html'})")
    return report


def _advice(sensitivity: dict, qp, cfg) -> str:
    """The five most sensitive layers still in INT8 and the settings to try."""
    int8 = {op.node: op.scope for op in qp.ops}
    worst = [n for n in sensitivity["ranking"] if n in int8][:5]
    rows = {r["node"]: r for r in sensitivity["ops"]}
    layers = "; ".join(f"{int8[n]} (output SQNR {rows[n]['output']['sqnr_db']:.1f} dB alone in INT8)" for n in worst)
    tries = []
    if cfg.quantization.fallback == "off":
        tries.append('quantization.fallback = "auto" (rolls the most sensitive layers back to float16)')
    else:
        tries.append(f"a larger quantization.max_fallback (now {cfg.quantization.max_fallback})")
    if cfg.calibration.method != "mse":
        tries.append('calibration.method = "mse"')
    tries.append("quantization.skip = [<layer>] for a layer above")
    return f". Most sensitive layers: {layers}. Try {'; or '.join(tries)}"
