"""export: everything atc may read, in one folder.  FP32: the network file (the MindIR, AIR where possible; or the
ONNX as given) and the graph stage's FP32 ONNX.  INT8: the Ascend deploy graph as ONNX (checked by onnx.checker
and shape inference) and as a MindSpore network (MindIR, and AIR where possible), and AMCT's record file."""
from __future__ import annotations

import json
from pathlib import Path

from quantflow.backends.deploy_mindspore import DEPLOY_MINDIR
from quantflow.io.atomic import copy_file, save_onnx, write_json, write_text

from .graph import GRAPH_ONNX
from .inputs import read_graph
from .stage import Stage

EXPORT_JSON, DEPLOY_ONNX, RECORD_TXT = "export.json", "deploy.onnx", "record.txt"


def export_stage(cfg, kdir: Path, graph_dir: Path, qparams_dir: Path) -> dict:
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
    copy_file(Path(graph_dir) / GRAPH_ONNX, kdir / GRAPH_ONNX)
    if cfg.model.entry:
        from quantflow.frontends.network import build_network
        status = {"mindir": EXPORTED_MINDIR, **export_air(build_network(cfg), cfg.model.input_shape, kdir, "model")}
    else:
        status = {"mindir": None if cfg.model.onnx else EXPORTED_MINDIR, "air": None,
                  "air_skipped": f"{source} was given without model.entry: AIR is exported from the network"}
    status["model_file"] = source
    graph = fold_for_quantization(read_graph(cfg, graph_dir))
    qp = QuantParams.load(qparams_dir)
    deploy = quantized_graph(graph, qp)
    model = deploy_model(deploy, cfg.model.input_name)
    check_deploy(model)
    save_onnx(model, kdir / DEPLOY_ONNX)
    write_text(kdir / RECORD_TXT, record_text(qp))
    status.update(export_deploy_mindir(deploy, kdir))
    status.update(fp32_onnx=GRAPH_ONNX, deploy_onnx=DEPLOY_ONNX, record=RECORD_TXT, int8_ops=len(qp.ops),
                  input_name=cfg.model.input_name)
    write_json(kdir / EXPORT_JSON, status)
    return status


def read_status(export_dir: Path) -> dict:
    return json.loads((Path(export_dir) / EXPORT_JSON).read_text())


def _run(b) -> None:
    kdir = b.dir("export")
    st = export_stage(b.cfg, kdir, b.dir("graph"), b.dir("fallback"))
    print(f"exported INT8 deploy graph ({st['int8_ops']} AscendQuant/AscendDequant pairs) -> {kdir / st['deploy_onnx']}, "
          f"{kdir / st['deploy_mindir']} (network source {st['deploy_net']}), AMCT record -> {kdir / st['record']}")
    if not st["deploy_air"]:
        print(f"SKIPPED deploy AIR export: {st['deploy_air_skipped']}")
    print(f"FP32 network -> {kdir / st['model_file']}, FP32 ONNX (graph IR) -> {kdir / st['fp32_onnx']}")
    if st["air"]:
        print(f"exported FP32 AIR -> {kdir / st['air']}")
    else:
        print(f"SKIPPED AIR export: {st['air_skipped']}")


def _summary(b) -> dict:
    d, st = b.dir("export"), read_status(b.dir("export"))

    def path(name: str | None) -> str | None:
        return str(d / name) if name else None

    return {"deploy_onnx": path(st["deploy_onnx"]), "deploy_mindir": path(st["deploy_mindir"]),
            "deploy_air": path(st.get("deploy_air")), "record": path(st["record"]), "mindir": path(st["mindir"]),
            "air": path(st["air"]), "model_file": path(st["model_file"])}


STAGE = Stage(
    name="export", doc="the INT8 deploy graphs (ONNX, MindIR; AIR on an Ascend host) and AMCT record; the FP32 "
                       "network",
    run=_run, needs=("graph", "fallback"), key_inputs=lambda b: {"input_name": b.cfg.model.input_name},
    outputs=(EXPORT_JSON, DEPLOY_ONNX, DEPLOY_MINDIR, RECORD_TXT), summary=_summary)
