"""atc: the offline model (.om) for ``build.soc_version``, converted by CANN's ``atc`` when it is found
(``quantflow.backends.atc``); a reported skip without CANN (a failure with ``build.require_om``).  The cached
result stands only while atc's availability is unchanged."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from quantflow.backends.atc import atc_command, find_atc, not_found_reason, precision_note, run_atc
from quantflow.errors import AtcError
from quantflow.io.atomic import PARTIAL, write_json, write_text

from .aipp import AIPP_CFG
from .export import read_status
from .stage import Stage

ATC_JSON, ATC_LOG = "atc.json", "atc.log"


def atc_model(cfg, export: dict) -> tuple[str, int]:
    """(model file, atc --framework) for build.atc_model: an AIR where one exists, else the ONNX; always the ONNX with
    build.batch_sizes (only it is free in the batch; atc takes no batch profiles for an AIR: CANN 8.0 ATC,
    --dynamic_batch_size)."""
    onnx_only = bool(cfg.build.batch_sizes) or bool(cfg.model.inputs)   # ONNX: the other inputs keep their names
    if cfg.build.atc_model == "fp32":
        return (export["air"], 1) if export.get("air") and not onnx_only else (export["fp32_onnx"], 5)
    return (export["deploy_air"], 1) if export.get("deploy_air") and not onnx_only else (export["deploy_onnx"], 5)


def conversions(cfg) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """The .om files atc writes: (output name, --input_shape, --dynamic_batch_size profiles).  One for
    model.input_shape without build.batch_sizes; with them, the FP32 network as one .om with atc's batch profiles,
    the INT8 deploy graph as one static .om per batch size (atc takes no dynamic-shape option for a quantized
    model: quantflow.backends.atc, DYNAMIC_SHAPE)."""
    shape, sizes = tuple(cfg.model.input_shape), tuple(cfg.build.batch_sizes)
    if not sizes:
        return [("model", shape, ())]
    if cfg.build.atc_model == "fp32":
        return [("model", shape, sizes)]
    return [(f"model_b{n}", (n,) + shape[1:], ()) for n in sizes]


def other_inputs(model: Path, framework: int) -> dict[str, list[int]]:
    """The inputs of the ONNX ``model`` atc converts other than the image (its first input: the graph IR's
    order, ``Graph.fixed_inputs``), name -> shape as declared (the batch, their first axis, 0 where it is free);
    none for an AIR."""
    import onnx

    from quantflow.engine.onnx_builder import graph_inputs

    if framework != 5:
        return {}
    inputs = graph_inputs(onnx.load(str(model), load_external_data=False))
    return {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in inputs[1:]}


def main_om(cfg, oms: dict) -> str | None:
    """The .om latest.json names as ``om`` (what ``quantflow verify`` runs): the one at model.input_shape's batch,
    else the first."""
    if not oms:
        return None
    return oms.get(str(cfg.model.input_shape[0]), next(iter(oms.values())))


def atc_stage(cfg, kdir: Path, export_dir: Path, aipp_dir: Path) -> dict:
    kdir, export_dir = Path(kdir), Path(export_dir)
    export = read_status(export_dir)
    atc = find_atc()
    status = {"atc": str(atc) if atc else None, "soc_version": cfg.build.soc_version, "model": cfg.build.atc_model,
              "om": None, "command": None, "precision_note": precision_note(cfg.build.precision_mode)}
    if cfg.build.batch_sizes:
        status.update(batch_sizes=list(cfg.build.batch_sizes), oms={}, commands=[])
    if status["precision_note"]:
        print(f"note: {status['precision_note']}")
    model, framework = atc_model(cfg, export)
    status.update(input=model, framework=framework)
    if atc is None:
        status.update(status="skipped", reason=not_found_reason())
    else:
        # atc writes into a scratch folder (a fixed name: the command is recorded in atc.json, and one build
        # runs per folder at a time); each finished .om is renamed into place
        scratch = kdir / f".atc{PARTIAL}d"
        shutil.rmtree(scratch, ignore_errors=True)
        built, logs = {}, []
        try:
            others = other_inputs(export_dir / model, framework) if cfg.model.inputs else {}
            for name, shape, profiles in conversions(cfg):
                # the other inputs hold the images on their first axis: at this .om's batch, or -1 with profiles
                at_batch = {k: [-1 if profiles else shape[0]] + v[1:] for k, v in others.items()}
                cmd = atc_command(atc, export_dir / model, framework, scratch / name, cfg.build.soc_version,
                                  Path(aipp_dir) / AIPP_CFG, cfg.build.precision_mode, cfg.model.input_name,
                                  shape, cfg.build.atc_args, profiles, at_batch)
                status["command"] = cmd
                print("running: " + " ".join(cmd))
                result = run_atc(cmd, scratch / name, cfg.build.atc_timeout_s)
                os.replace(scratch / result["om"], kdir / result["om"])
                built[",".join(map(str, profiles)) if profiles else str(shape[0])] = result["om"]
                logs.append(result["log"])
                if cfg.build.batch_sizes:
                    status["commands"].append(cmd)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if cfg.build.batch_sizes:
            status["oms"] = built
        status.update(status="built", om=main_om(cfg, built), reason=None)
        write_text(kdir / ATC_LOG, "\n".join(logs) + "\n")
    write_json(kdir / ATC_JSON, status)
    if status["status"] == "skipped":
        msg = f"SKIPPED atc conversion for {cfg.build.soc_version}: {status['reason']}; no .om was written"
        if cfg.build.require_om:
            raise AtcError(msg + " (build.require_om = true)")
        print(msg)
    else:
        for om in dict.fromkeys([status["om"], *status.get("oms", {}).values()]):
            print(f"built offline model {kdir / om} for {cfg.build.soc_version}")
    return status


def _uptodate(b) -> bool:
    """The cached atc result stands only while atc's availability is unchanged."""
    try:
        recorded = json.loads((b.dir("atc") / ATC_JSON).read_text())
    except (OSError, ValueError):
        return False
    atc = find_atc()
    return recorded.get("atc") == (str(atc) if atc else None)


def _atc_identity() -> str | None:
    """Which atc converts (its path; None without CANN), in the key: a runner without CANN and an Ascend host do not
    share an entry through the artifact cache, so a skip never stands in for an .om."""
    atc = find_atc()
    return str(atc) if atc else None


def _summary(b) -> dict:
    atc = json.loads((b.dir("atc") / ATC_JSON).read_text())
    out = {"om": str(b.dir("atc") / atc["om"]) if atc.get("om") else None,
           "atc": atc["status"] if atc["status"] != "skipped" else f"skipped: {atc['reason']}"}
    if "oms" in atc:   # build.batch_sizes: the INT8 .om of each batch size
        out["oms"] = {n: str(b.dir("atc") / om) for n, om in atc["oms"].items()}
    return out


STAGE = Stage(
    name="atc", doc="atc conversion to an .om for build.soc_version (a reported skip without CANN)",
    run=lambda b: atc_stage(b.cfg, b.dir("atc"), b.dir("export"), b.dir("aipp")), needs=("export", "aipp"),
    key_inputs=lambda b: {"build": b.cfg.model_dump(mode="json")["build"], "input_name": b.cfg.model.input_name,
                          "input_shape": list(b.cfg.model.input_shape), "atc": _atc_identity()},
    outputs=(ATC_JSON,), uptodate=_uptodate, summary=_summary)
