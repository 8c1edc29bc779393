"""export: everything atc may read, in one folder.  FP32: the network file (the MindIR, AIR where possible; or the
ONNX as given) and the graph stage's FP32 ONNX.  INT8: the Ascend deploy graph as ONNX (checked by onnx.checker
and shape inference) and as a MindSpore network (MindIR, and AIR where possible), and AMCT's record file.  With
build.batch_sizes, deploy.onnx is free in the batch and its emulation checked at the largest batch against its
images one at a time (``quantflow.backends.batch``); the check's report goes into export.json."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx

from quantflow.backends.deploy_mindspore import DEPLOY_MINDIR
from quantflow.io.atomic import copy_file, save_onnx, write_json, write_text

from .graph import GRAPH_ONNX
from .inputs import image_batches, read_graph
from .stage import Stage

EXPORT_JSON, DEPLOY_ONNX, RECORD_TXT = "export.json", "deploy.onnx", "record.txt"


def export_stage(cfg, kdir: Path, graph_dir: Path, qparams_dir: Path, calibration_paths=()) -> dict:
    """Writes the stage's files into ``kdir``; with build.batch_sizes, deploy.onnx (and for build.atc_model "fp32"
    graph.onnx) free in the batch and checked (``batch_consistency``) on ``calibration_paths``."""
    from quantflow.backends.batch import free_batch
    from quantflow.backends.deploy_mindspore import export_deploy_mindir
    from quantflow.backends.deploy_onnx import check_deploy, deploy_model, record_text
    from quantflow.backends.export import export_air
    from quantflow.frontends.source import EXPORTED_MINDIR, model_file
    from quantflow.quantization.deploy import quantized_graph
    from quantflow.quantization.passes import fold_for_quantization
    from quantflow.quantization.qparams import QuantParams

    kdir = Path(kdir)
    source = "model.onnx" if cfg.model.onnx else EXPORTED_MINDIR
    copy_file(model_file(cfg, graph_dir), kdir / source)
    checks = {}
    source_graph = read_graph(cfg, graph_dir)
    if cfg.build.batch_sizes and cfg.build.atc_model == "fp32":   # atc converts graph.onnx with batch profiles
        fp32 = free_batch(onnx.load(str(Path(graph_dir) / GRAPH_ONNX)), GRAPH_ONNX, source_graph.constant_outputs)
        checks["fp32_batch_check"] = check_free_batch(fp32, cfg, calibration_paths, GRAPH_ONNX, np.float32,
                                                      fixed=fixed_feeds(source_graph, fp32))
        save_onnx(fp32, kdir / GRAPH_ONNX)
    else:
        copy_file(Path(graph_dir) / GRAPH_ONNX, kdir / GRAPH_ONNX)
    if cfg.model.entry:
        from quantflow.frontends.network import build_network
        status = {"mindir": EXPORTED_MINDIR, **export_air(build_network(cfg), cfg.model.input_shape, kdir, "model")}
    else:
        status = {"mindir": None if cfg.model.onnx else EXPORTED_MINDIR, "air": None,
                  "air_skipped": f"{source} was given without model.entry: AIR is exported from the network"}
    status.update(model_file=source, **checks)
    graph = fold_for_quantization(source_graph)
    qp = QuantParams.load(qparams_dir)
    deploy = quantized_graph(graph, qp)
    model = deploy_model(deploy, cfg.model.input_name)
    if cfg.build.batch_sizes:
        model = free_batch(model, DEPLOY_ONNX, deploy.constant_outputs)
        status["batch_check"] = batch_consistency(cfg, deploy, calibration_paths)
    check_deploy(model)
    save_onnx(model, kdir / DEPLOY_ONNX)
    write_text(kdir / RECORD_TXT, record_text(qp))
    status.update(export_deploy_mindir(deploy, kdir))
    status.update(fp32_onnx=GRAPH_ONNX, deploy_onnx=DEPLOY_ONNX, record=RECORD_TXT, int8_ops=len(qp.ops),
                  input_name=cfg.model.input_name)
    write_json(kdir / EXPORT_JSON, status)
    return status


def batch_consistency(cfg, deploy, calibration_paths) -> dict:
    """The INT8 emulation of the deploy IR ``deploy`` made free in the batch as deploy.onnx is, run on a batch of the
    largest of build.batch_sizes and on each image alone (``quantflow.backends.batch.batch_check``); the report,
    or UnsupportedNetworkError naming the output that differs and by how much."""
    from quantflow.backends.batch import free_batch
    from quantflow.engine.int8_emulator import keeps_every_step
    from quantflow.engine.lowering import lower

    emulation = free_batch(lower(deploy, "float16"), f"{DEPLOY_ONNX} (its INT8 emulation)")
    return check_free_batch(emulation, cfg, calibration_paths, f"{DEPLOY_ONNX} (INT8 emulation)", np.float16,
                            keeps_every_step(emulation), fixed_feeds(deploy, emulation))


def fixed_feeds(graph, model) -> dict:
    """``graph``'s other inputs' values (``Graph.fixed_inputs``) by the names of ``model``, its lowering (whose
    inputs are the graph's, in order, some renamed)."""
    from quantflow.engine.onnx_builder import graph_inputs

    names = dict(zip(graph.inputs, (i.name for i in graph_inputs(model))))
    return {names[k]: v for k, v in graph.fixed_inputs.items()}


def check_free_batch(model, cfg, calibration_paths, what: str, dtype, keeps=None, fixed=None) -> dict:
    """``batch_check`` of ``model`` on calibration images in the training preprocessing (as ``dtype``: the
    emulation's float16 input stands for the AIPP output), its other inputs fed ``fixed`` (``fixed_feeds``);
    raises where a batch differs from its images alone."""
    from quantflow.backends.batch import batch_check
    from quantflow.errors import DataError, UnsupportedNetworkError

    largest = max(cfg.build.batch_sizes)
    paths = list(calibration_paths)[:largest]
    if not paths:
        raise DataError("build.batch_sizes: no calibration images to check the batch-free deploy graph on")
    images = next(iter(image_batches(cfg, paths, len(paths)))).astype(dtype)
    report = batch_check(model, images, largest, keeps, fixed)
    if not report["identical"]:
        worst = report["outputs"][report["worst"]]
        raise UnsupportedNetworkError(
            f"{what}: at batch {largest} output {report['worst']!r} differs from the same {report['images']} "
            f"images run one at a time in {worst['differing']} values (largest difference "
            f"{worst['max_abs_diff']:.6g}); the graph does not run its samples independently, so build.batch_sizes "
            f"cannot be used with it")
    return report


def read_status(export_dir: Path) -> dict:
    return json.loads((Path(export_dir) / EXPORT_JSON).read_text())


def _run(b) -> None:
    kdir = b.dir("export")
    st = export_stage(b.cfg, kdir, b.dir("graph"), b.dir("fallback"), b.calibration_paths())
    print(f"exported INT8 deploy graph ({st['int8_ops']} AscendQuant/AscendDequant pairs) -> {kdir / st['deploy_onnx']}, "
          f"{kdir / st['deploy_mindir']} (network source {st['deploy_net']}), AMCT record -> {kdir / st['record']}")
    if not st["deploy_air"]:
        print(f"SKIPPED deploy AIR export: {st['deploy_air_skipped']}")
    print(f"FP32 network -> {kdir / st['model_file']}, FP32 ONNX (graph IR) -> {kdir / st['fp32_onnx']}")
    for key, what in (("batch_check", "INT8 emulation of deploy.onnx"), ("fp32_batch_check", "graph.onnx")):
        if key in st:
            print(f"batch sizes {b.cfg.build.batch_sizes}: the {what} at batch {st[key]['batch']} gives what its "
                  f"{st[key]['images']} images give one at a time, bit for bit")
    if st["air"]:
        print(f"exported FP32 AIR -> {kdir / st['air']}")
    else:
        print(f"SKIPPED AIR export: {st['air_skipped']}")


def _summary(b) -> dict:
    d, st = b.dir("export"), read_status(b.dir("export"))

    def path(name: str | None) -> str | None:
        return str(d / name) if name else None

    out = {"deploy_onnx": path(st["deploy_onnx"]), "deploy_mindir": path(st["deploy_mindir"]),
           "deploy_air": path(st.get("deploy_air")), "record": path(st["record"]), "mindir": path(st["mindir"]),
           "air": path(st["air"]), "model_file": path(st["model_file"])}
    if "batch_check" in st:   # build.batch_sizes: which batch the check ran and that it agreed
        out["batch_check"] = {k: st["batch_check"][k] for k in ("batch", "images", "identical")}
    return out


def _key_inputs(b) -> dict:
    """The batch sizes change deploy.onnx (and graph.onnx for atc_model "fp32"), and what the check reads."""
    key = {"input_name": b.cfg.model.input_name}
    if b.cfg.build.batch_sizes:
        key.update(batch_sizes=list(b.cfg.build.batch_sizes), atc_model=b.cfg.build.atc_model,
                   manifest=b.manifest_digest())
    return key


STAGE = Stage(
    name="export", doc="the INT8 deploy graphs (ONNX, MindIR; AIR on an Ascend host) and AMCT record; the FP32 "
                       "network (with build.batch_sizes: deploy.onnx free in the batch, checked)",
    run=_run, needs=("graph", "fallback"), key_inputs=lambda b: _key_inputs(b),
    outputs=(EXPORT_JSON, DEPLOY_ONNX, DEPLOY_MINDIR, RECORD_TXT), summary=_summary)
