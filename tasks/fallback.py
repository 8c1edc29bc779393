"""fallback: the INT8 parameters the build uses: as calibrated (``quantization.fallback = "off"``), or with
"auto" those left once the most sensitive ops were rolled back to float16 until the gate's check passes on the
held-out images (or ``max_fallback`` ops are in float); each next op the most sensitive on what the last check
failed (the outputs gate: the outputs below the limit)."""
from __future__ import annotations

import json
from pathlib import Path

from quantflow.data.images import IMAGE_EXTS
from quantflow.engine import shard
from quantflow.io.atomic import write_json
from quantflow.io.digest import folder_digest
from quantflow.quantization.qparams import QPARAMS_JSON, QPARAMS_NPZ, QuantParams

from .aipp import read_params
from .calibrate import SENSITIVITY_JSON
from .inputs import evaluation_set, read_graph
from .stage import Stage

FALLBACK_JSON = "fallback.json"


def fallback_stage(cfg, kdir: Path, calibrate_dir: Path, graph_dir: Path, aipp_dir: Path | None) -> dict:
    from quantflow.evaluation.metrics import metric
    from quantflow.quantization.fallback import roll_back
    from quantflow.quantization.passes import fold_for_quantization
    from quantflow.quantization.sensitivity import rank

    kdir, q = Path(kdir), cfg.quantization
    qp = QuantParams.load(calibrate_dir)
    if q.fallback == "off":
        result = {"mode": "off", "steps": [], "float_ops": []}
    else:
        ev = evaluation_set(cfg)
        print(f"fallback: accuracy checks on {len(ev)} held-out images {shard.where(cfg.engine)}")
        graph = read_graph(cfg, graph_dir)
        m = metric(cfg.evaluation.metric)
        check = m.checker(ev, cfg.evaluation, graph, fold_for_quantization(graph), read_params(aipp_dir))
        sensitivity = json.loads((Path(calibrate_dir) / SENSITIVITY_JSON).read_text())
        qp, steps = roll_back(qp, sensitivity["ranking"], check, q.max_fallback, m.step_keys,
                              rerank=lambda report: rank(sensitivity["ops"], m.focus(report)))
        result = {"mode": "auto", "metric": m.name, "max_fallback": q.max_fallback, "steps": steps,
                  "float_ops": steps[-1]["float_ops"], "passed": steps[-1]["passed"]}
        for i, st in enumerate(steps):
            names = ", ".join(f["scope"] for f in st["float_ops"]) or "none"
            print(f"fallback step {i}: {st['int8_ops']} INT8 ops, {m.step_line(st)} "
                  f"{'PASS' if st['passed'] else 'fail'}; in float16: {names}")
    qp.save(kdir)
    write_json(kdir / FALLBACK_JSON, result)
    return result


def _auto(cfg) -> bool:
    return cfg.quantization.fallback == "auto"


def _run(b) -> None:
    c = b.cfg
    result = fallback_stage(c, b.dir("fallback"), b.dir("calibrate"), b.dir("graph"),
                            b.dir("aipp") if _auto(c) else None)
    if result["mode"] == "off":
        print("quantization.fallback = off: every calibrated op stays INT8")
    else:
        names = ", ".join(f["scope"] for f in result["float_ops"]) or "none"
        print(f"fallback: {len(result['float_ops'])} op(s) rolled back to float16 ({names}); "
              f"{'passes' if result['passed'] else 'still fails'} the accuracy check")


def _key_inputs(b) -> dict:
    cfg = b.cfg
    if not _auto(cfg):
        return {"fallback": "off"}
    c = cfg.model_dump(mode="json")
    return {"fallback": "auto", "max_fallback": cfg.quantization.max_fallback, "evaluation": c["evaluation"],
            "eval_data": folder_digest(cfg.path(cfg.evaluation.data_dir), IMAGE_EXTS),
            "normalization": c["normalization"], "num_classes": cfg.model.num_classes}


def _summary(b) -> dict:
    result = json.loads((b.dir("fallback") / FALLBACK_JSON).read_text())
    return {"qparams": str(b.dir("fallback") / QPARAMS_JSON), "float16_fallback": [f["scope"] for f in result["float_ops"]]}


STAGE = Stage(
    name="fallback", doc='the INT8 parameters used: as calibrated, or (fallback = "auto") the most sensitive ops in '
                         'float16',
    run=_run, needs=lambda cfg: ("graph", "calibrate") + (("aipp",) if _auto(cfg) else ()), key_inputs=_key_inputs,
    outputs=(QPARAMS_JSON, QPARAMS_NPZ, FALLBACK_JSON), summary=_summary)
