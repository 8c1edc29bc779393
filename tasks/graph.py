"""graph: the network (the MindIR exported from model.entry + model.checkpoint, model.mindir, or model.onnx) read
into the graph IR, whose float output is checked against the source runtime's (MindSpore, or onnxruntime on the
ONNX file as given) on calibration images."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from quantflow.errors import UnsupportedNetworkError
from quantflow.io.atomic import save_onnx, write_json

from .inputs import image_batches, read_graph
from .stage import Stage

GRAPH_JSON, GRAPH_ONNX = "graph.json", "graph.onnx"   # what was read and checked; the IR as float ONNX


def verify_graph(graph, x: np.ndarray, reference: np.ndarray, where, tolerance: float,
                 runtime: str = "MindSpore") -> dict:
    """Compare the IR's float output (onnxruntime) on ``x`` with ``reference``, the source runtime's
    output of the same network (``runtime`` names it); raise when beyond tolerance."""
    from quantflow.engine.runner import float_runner

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
    from quantflow.backends.export import export_mindir
    from quantflow.engine.lowering import lower
    from quantflow.frontends.network import build_network
    from quantflow.frontends.source import check_given_file, model_file, reference_outputs, source_field
    from quantflow.ops import get as get_op
    from quantflow.quantization.passes import fold_for_quantization
    from quantflow.quantization.calibrater import quantizable_nodes

    kdir = Path(kdir)
    check_given_file(cfg)
    if cfg.model.entry:
        export_mindir(build_network(cfg), cfg.model.input_shape, model_file(cfg, kdir))
        source = f"exported from {cfg.model.entry} + {cfg.path(cfg.model.checkpoint)}"
    else:
        source = f"{source_field(cfg)} {model_file(cfg, kdir)}"
    path = model_file(cfg, kdir)
    graph = read_graph(cfg, kdir)
    shape = graph.tensors[graph.inputs[0]].shape
    if tuple(shape) != tuple(cfg.model.input_shape):
        raise UnsupportedNetworkError(f"{path}: the network input is {list(shape)}, model.input_shape says "
                                      f"{list(cfg.model.input_shape)}")
    n = cfg.model.verify_images
    x = next(iter(image_batches(cfg, calibration_paths[:n], n)))
    reference = reference_outputs(cfg, kdir, x, shape[0], graph.fixed_inputs)
    check = verify_graph(graph, x, reference, path, cfg.model.verify_tolerance,
                         "onnxruntime (the ONNX file as given)" if cfg.model.onnx else "MindSpore")
    save_onnx(lower(graph, "float32", input_name=cfg.model.input_name, constant_outputs=True), kdir / GRAPH_ONNX)
    folded = fold_for_quantization(graph)
    approximate = sorted(op for op in folded.op_counts() if not get_op(op).exact_in_fp16)
    quantizable = {n.name for n in quantizable_nodes(folded)}
    info = {"source": source, "model_file": str(path), "nodes": len(graph.nodes), "ops": graph.op_counts(),
            "parameters": int(sum(v.size for v in graph.initializers.values())), "verify": check,
            "float16_assumed_ops": approximate,
            "constant_outputs": {k: list(v.shape) for k, v in graph.constant_outputs.items()},
            "fixed_inputs": {k: v.tolist() for k, v in graph.fixed_inputs.items()},
            # the quantizable ops computed from each of them: where none, its value changes nothing quantized
            "fixed_inputs_reach": {k: [n.name for n in folded.downstream([k]) if n.name in quantizable]
                                   for k in graph.fixed_inputs}}
    write_json(kdir / GRAPH_JSON, info)
    return info


def _run(b) -> None:
    info = graph_stage(b.cfg, b.dir("graph"), b.calibration_paths())
    v = info["verify"]
    ops = ", ".join(f"{k} {n}" for k, n in info["ops"].items())
    print(f"graph IR of {info['model_file']} ({info['source']}): {info['nodes']} nodes ({ops})")
    print(f"IR float output matches {v['reference']} on {v['images']} calibration images: largest |diff| "
          f"{v['max_abs_diff']:.2e} (relative {v['relative_diff']:.2e}, tolerance {v['tolerance']:g})")
    for name, shape in info.get("constant_outputs", {}).items():
        print(f"note: output {name} (shape {shape}) is a constant: it depends on no input, so it is not run, calibrated "
              f"or gated; graph.onnx and deploy.onnx keep it, after the computed outputs")
    for name, value in info.get("fixed_inputs", {}).items():
        reach = info.get("fixed_inputs_reach", {}).get(name, [])
        what = (f"it reaches {len(reach)} quantizable op(s) ({reach[0]}{', ...' if len(reach) > 1 else ''}): its value "
                f"is part of what is calibrated" if reach else
                "it reaches no quantizable op: its value changes nothing that is quantized")
        print(f"input {name} fed {value} with every image (model.inputs); {what}; deploy.onnx keeps it as an input")
    if info["float16_assumed_ops"]:
        print(f"note: the INT8 emulation models {', '.join(info['float16_assumed_ops'])} as float32 math rounded to "
              f"float16; the device's own float16 kernels may differ in the last bit")


def _key_inputs(b) -> dict:
    c, m = b.cfg, b.cfg.model
    return {"model": c.model_dump(mode="json")["model"],
            "checkpoint": b.file_digest(m.checkpoint and c.path(m.checkpoint)),
            "mindir": b.file_digest(m.mindir and c.path(m.mindir)), "onnx": b.file_digest(m.onnx and c.path(m.onnx)),
            "manifest": b.manifest_digest(), "normalization": c.model_dump(mode="json")["normalization"]}


STAGE = Stage(
    name="graph", doc="the network read into the graph IR, checked against its source runtime", run=_run,
    needs=("train", "sample"), key_inputs=_key_inputs, outputs=(GRAPH_JSON, GRAPH_ONNX),
    summary=lambda b: {"graph_onnx": str(b.dir("graph") / GRAPH_ONNX)})
