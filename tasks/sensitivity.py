"""sensitivity: the per-layer error analysis (``sensitivity.json``, ``sensitivity.txt``): each INT8 op alone in INT8
against FP32 on the first ``quantization.sensitivity_images`` calibration images
(``quantflow.quantization.sensitivity``), on the recovered parameters (the ``recover`` stage's).

Where the gate judges parts of outputs (``evaluation.parts``), each part is measured on its own too.

It is a build's costliest work and only needed to choose layers, so it runs as a stage when something reads it in
every build: ``quantization.fallback = "auto"`` (the fallback rolls layers back in its order) or
``quantization.sensitivity = "always"`` (the report's sensitivity section).  Otherwise the gate runs it
(``ensure``) only when it fails, to name the layers to try in its message and its report.  Either way it is keyed
like any stage (on the calibration's key and its own images), so it runs once per calibration."""
from __future__ import annotations

import json

from quantflow.engine import shard
from quantflow.io.atomic import write_json, write_text
from quantflow.quantization.qparams import QuantParams

from .inputs import image_batches, output_names, parameters_dir, read_graph
from .stage import Stage

NAME = "sensitivity"
SENSITIVITY_JSON, SENSITIVITY_TXT = "sensitivity.json", "sensitivity.txt"
CONSOLE_LAYERS = 5   # the most sensitive layers the console shows


def used(cfg) -> bool:
    """Does every build of ``cfg`` need the analysis (else only a failing gate runs it)."""
    q = cfg.quantization
    return q.fallback == "auto" or q.sensitivity == "always"


def _run(b) -> None:
    from quantflow.quantization.passes import fold_for_quantization
    from quantflow.quantization.sensitivity import analyse

    cfg, kdir = b.cfg, b.dir(NAME)
    qp = QuantParams.load(parameters_dir(b))
    graph = fold_for_quantization(read_graph(cfg, b.dir("graph")))
    paths = b.calibration_paths()[:cfg.quantization.sensitivity_images]
    print(f"per-layer analysis: {len(qp.ops)} INT8 ops, each alone in INT8, on {len(paths)} calibration images "
          f"{shard.where(cfg.engine)}")
    s = analyse(graph, qp, image_batches(cfg, paths, cfg.calibration.batch_size), engine=cfg.engine,
                parts=_parts(cfg, graph))
    write_json(kdir / SENSITIVITY_JSON, s.as_dict())
    write_text(kdir / SENSITIVITY_TXT, f"per-layer sensitivity on {s.images} calibration images (most sensitive "
                                       f"first)\n{s.table()}\n")
    print(f"most sensitive layers (all {len(qp.ops)} in {kdir / SENSITIVITY_TXT}):\n{s.table(CONSOLE_LAYERS)}")


def _parts(cfg, graph) -> dict:
    """The gate's ``evaluation.parts`` as ``analyse`` measures them: name -> (graph output, region), so that the
    fallback can rank layers on the part that fails (a detector's class scores, not its boxes)."""
    if not cfg.evaluation.parts:
        return {}
    from quantflow.evaluation.outputs import network_regions

    names = output_names(cfg, graph) or {}
    ir = {names.get(o, o): o for o in graph.outputs}
    return {r.part: (ir[r.output], r) for r in network_regions(graph, cfg.evaluation, names=names) if r.part}


def read(b) -> dict | None:
    """The analysis of build ``b`` under its current key, None when it has not run."""
    return json.loads((b.dir(NAME) / SENSITIVITY_JSON).read_text()) if b.done(NAME) else None


def path(b) -> str | None:
    """``sensitivity.json`` of build ``b`` under its current key, None when the analysis has not run."""
    return str(b.dir(NAME, create=False) / SENSITIVITY_JSON) if b.done(NAME) else None


def ensure(b) -> dict:
    """The analysis of build ``b``, run now (and kept under its key, as the stage would: pulled from the build's
    artifact cache where it holds it, else run and pushed) when it has not run."""
    if not b.done(NAME):
        pulled = b.pull(STAGE)
        if not pulled:
            _run(b)
        b.mark_done(NAME)
        if not pulled:
            b.push(STAGE)
    return read(b)


def _key_inputs(b) -> dict:
    # the batching too: the running sums add one batch at a time
    c = b.cfg
    return {"sensitivity_images": c.quantization.sensitivity_images, "batch_size": c.calibration.batch_size,
            "parts": c.model_dump(mode="json")["evaluation"]["parts"]}


STAGE = Stage(
    name=NAME, doc="per-layer analysis: each INT8 op alone in INT8 against FP32 (for fallback 'auto' or 'always')",
    run=_run, needs=("sample", "graph", "calibrate", "recover", "retrain"), key_inputs=_key_inputs, used=used,
    outputs=(SENSITIVITY_JSON, SENSITIVITY_TXT))
