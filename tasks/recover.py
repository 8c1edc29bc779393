"""recover: the INT8 parameters brought closer to FP32 before the fallback may give any layer up to float16
(``quantflow.quantization.recovery``): ``qparams`` (with the recovered float weights), ``recovery.json`` (per INT8
op, its output SQNR with all ops in INT8, before recovery and after each method), ``recovery.txt``.

Where it checked the tuning images, the check of the parameters it saved is kept beside them (``TUNING_CHECK``,
the checker's report as JSON, its bootstrap draws beside it in ``TUNING_CHECK_DRAWS``; nothing a build writes is a
pickle, since artifacts cross machines through the cache): the fallback's step 0, on those same parameters and images, takes it instead
of checking again.

``quantization.recover``:

- ``"auto"``: the cheap methods in every build (cross-layer equalization of the tensors whose median channel range
  is below 1/32 of the widest), each kept only where it raises the network's output SQNR on the first
  ``quantization.recovery_images`` calibration images; with
  ``quantization.fallback = "auto"``, the costly ones (output-aware ranges, learned rounding) too when the gate's
  check on the fallback's tuning images gives a verdict the gate would not pass (``fallback.tuning_settled``), before
  the fallback rolls any layer back, one at a time, each checked on the tuning images and kept unless that check
  says it harms (``costly_kept``; else the parameters before it, the step marked ``undone_by``).  With
  ``fallback = "off"`` there are no tuning images (the gate's must not be tuned on): the cheap methods only;
- ``"off"``: the calibrated parameters as they are;
- a list of method names: those, in that order, unguarded.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from quantflow.io.atomic import save_npz, write_json, write_text
from quantflow.io.files import TUNING_CHECK, TUNING_CHECK_DRAWS
from quantflow.quantization.qparams import QPARAMS_JSON, QPARAMS_NPZ, QuantParams

from .inputs import compared_regions, image_batches, output_names, read_graph, recalibrator
from .stage import Stage

NAME = "recover"
RECOVERY_JSON, RECOVERY_TXT = "recovery.json", "recovery.txt"


def _checks(cfg) -> bool:
    """Does "auto" check the tuning images (and so run the costly methods when it fails)."""
    q = cfg.quantization
    return q.recover == "auto" and q.fallback == "auto"


def recover_stage(cfg, kdir: Path, calibrate_dir: Path, graph_dir: Path, calibration_paths: list[Path],
                  aipp_dir: Path | None = None) -> dict:
    from quantflow.quantization.passes import fold_for_quantization
    from quantflow.quantization.recovery import CHEAP, COSTLY, Context, recover
    from quantflow.quantization.recovery.report import text_table

    from .fallback import tuning_and_gate_sets, tuning_settled

    kdir, q, k = Path(kdir), cfg.quantization, cfg.calibration
    qp = QuantParams.load(calibrate_dir)
    if q.recover == "off":
        qp.save(kdir)
        record = {"mode": "off", "steps": []}
        write_json(kdir / RECOVERY_JSON, record)
        write_text(kdir / RECOVERY_TXT, "quantization.recover = off\n")
        return record
    raw = read_graph(cfg, graph_dir)
    graph = fold_for_quantization(raw)
    inputs = [np.asarray(x) for x in image_batches(cfg, calibration_paths[:q.recovery_images], k.batch_size)]
    auto = q.recover == "auto"
    ctx = Context(graph, inputs, recalibrator(cfg, graph, calibration_paths), q.recovery_iterations, auto=auto,
                  regions=compared_regions(cfg, graph))
    print(f"recovery ({'auto: ' + ', '.join(CHEAP) if auto else ', '.join(q.recover)}) on {len(calibration_paths[:q.recovery_images])} "
          f"calibration images")
    qp, record = recover(ctx, qp, CHEAP if auto else q.recover, guard=auto)
    record["mode"] = "auto" if auto else "list"
    if auto and _checks(cfg):
        # the fallback's own rule (fallback.tuning_settled): only a check the gate would not pass on the tuning
        # images asks for more
        check = _tuning_check(cfg, raw, graph, aipp_dir)
        first = last = check(qp)
        looks = 1
        gate_images = len(tuning_and_gate_sets(cfg)[1])
        record["check"] = {"passed": bool(first["passed"]), "verdict": first["verdict"], "ops": len(qp.ops)}
        if not tuning_settled(first, cfg.evaluation.on_undecided, gate_images, looks):
            print(f"recovery: the check on the tuning images is {first['verdict']}; {', '.join(COSTLY)} before any "
                  f"fallback")
            qp, record, last, made = costly_checked(qp, record, last, COSTLY,
                                                    lambda name, p, r: recover(ctx, p, (name,), record=r), check,
                                                    cfg.evaluation.on_undecided)
            looks += made
            record["check_after"] = {**_said(last), "ops": len(qp.ops),
                                     "kept": any(st.get("kept") for st in record["steps"]
                                                 if st["method"] in COSTLY and st.get("check"))}
        write_check(kdir, {**last, "looks": looks})
    qp.save(kdir)
    write_json(kdir / RECOVERY_JSON, record)
    write_text(kdir / RECOVERY_TXT, text_table(record) + "\n")
    return record


def costly_checked(qp, record: dict, last: dict, methods, run, check, on_undecided: str):
    """(parameters, record, the check of those parameters, the checks made): the costly ``methods`` in order, each
    run (``run(name, qp, record)``: ``recovery.recover`` unguarded), checked on the tuning images (``check(qp)``)
    and kept by ``costly_kept`` against ``last`` (the check of the parameters it started from), else undone (its
    step marked ``undone_by``).  Judged on the tuning images, not by the recovery's own guard: fitted to the
    recovery images, a method's figure there is in-sample and a few images can lead it (ddddocr's captcha reader,
    image seed 3: learned rounding lowered the output SQNR on the 32 recovery images 27.8 -> 27.5 dB and raised it
    on the 664 tuning images 27.7 -> 31.1 dB).  A method that changed nothing costs no check."""
    from quantflow.evaluation.steering import line as steering_line

    made = 0
    for name in methods:
        before = qp
        qp, record = run(name, qp, record)
        if qp is before:
            continue
        again = check(qp)
        made += 1
        record["steps"][-1]["check"] = _said(again)
        if costly_kept(last, again, on_undecided):
            last = again
            continue
        qp = before
        undo(record, len(record["steps"]) - 1)
        print(f"recovery: {name} made the check on the tuning images worse (" + (
            f"{steering_line(last['steering'])} -> {steering_line(again['steering'])}"
            if last.get("steering") and again.get("steering") else f"{last['verdict']} -> {again['verdict']}")
            + "): the parameters before it are kept")
    return qp, record, last, made


def costly_kept(first: dict, again: dict, on_undecided: str) -> bool:
    """Whether a costly method's parameters (checked ``again`` on the tuning images) replace those it started
    from (checked ``first``): unless the tuning images, which it did not learn from, say it harms -- the
    parameters before it better by the fallback's own rule for a layer (``fallback.improves``: the steering
    figure at least ``steering.MIN_GAIN`` lower) and ``again`` not a verdict the gate would pass.  Fitted to the
    recovery images alone, they can move INT8 away from FP32 on every other image: on the MobileNetV3-small example
    (calibration seeds 1-4) they raised the KL divergence on the tuning images from 0.0029-0.0067 to
    0.0054-0.0094 nats.  A gain too small to show is no reason to undo them: where one collapsing layer dominates
    what the check fails on (a detector's scores part at 0.1 dB), only the fallback's roll-back of that layer lets
    their gain on the rest show."""
    from .fallback import improves, tuning_settled

    return tuning_settled(again, on_undecided) or not improves(first, again)


def undo(record: dict, ran: int) -> None:
    """Marks the recovery's steps from index ``ran`` on (the costly methods') as not kept, by the tuning check."""
    for s in record["steps"][ran:]:
        if s["kept"]:
            s.update(kept=False, undone_by="tuning check")


def _said(check: dict) -> dict:
    """What recovery.json keeps of a check of the tuning images: its verdict and steering figure."""
    return {"passed": bool(check["passed"]), "verdict": check["verdict"],
            **({"steering": _public(check["steering"])} if check.get("steering") else {})}


def _public(steering: dict) -> dict:
    """A steering figure as JSON holds it."""
    return {k: v for k, v in steering.items() if k in ("figure", "value", "flip_rate")}


def _tuning_check(cfg, raw, folded, aipp_dir):
    """The fallback's accuracy check on its tuning images (never the gate's)."""
    from quantflow.evaluation import floor
    from quantflow.evaluation.metrics import metric

    from .aipp import read_params
    from .fallback import tuning_and_gate_sets

    tune, _, _ = tuning_and_gate_sets(cfg)
    return floor.checker(metric(cfg.evaluation.metric), tune, cfg.evaluation, raw, folded, read_params(aipp_dir),
                         output_names(cfg, raw))


def write_check(kdir: Path, check: dict) -> None:
    """A checker's report as ``TUNING_CHECK`` (JSON) and its bootstrap draws as ``TUNING_CHECK_DRAWS``; the draws
    first, so that the JSON (what ``inputs.recovered_check`` looks for) is the last write."""
    from quantflow.evaluation.verdicts import DRAWS

    save_npz(kdir / TUNING_CHECK_DRAWS, {k: np.asarray(v, np.float64) for k, v in check.get(DRAWS, {}).items()})
    write_json(kdir / TUNING_CHECK, {k: v for k, v in check.items() if k != DRAWS}, sort_keys=False,
               default=_plain)


def _plain(value):
    """NumPy scalars and arrays as JSON's numbers and lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def read(recover_dir: Path) -> dict:
    return json.loads((Path(recover_dir) / RECOVERY_JSON).read_text())



def _run(b) -> None:
    from quantflow.quantization.recovery.report import text_table

    record = recover_stage(b.cfg, b.dir(NAME), b.dir("calibrate"), b.dir("graph"), b.calibration_paths(),
                           b.dir("aipp") if _checks(b.cfg) else None)
    if record["mode"] != "off":
        print(text_table(record, top=8))


def _key_inputs(b) -> dict:
    q = b.cfg.quantization
    if q.recover == "off":
        return {"recover": "off"}
    key = {"recover": q.model_dump(mode="json")["recover"], "recovery_images": q.recovery_images,
           "recovery_iterations": q.recovery_iterations, "batch_size": b.cfg.calibration.batch_size}
    if _checks(b.cfg):
        from .fallback import evaluation_inputs

        c = b.cfg.model_dump(mode="json")
        key.update(evaluation=c["evaluation"], **evaluation_inputs(b.cfg), normalization=c["normalization"],
                   num_classes=b.cfg.model.num_classes)
    return key


STAGE = Stage(
    name=NAME, doc="recovery before any fallback: cross-layer equalization; output-aware ranges and learned "
                   "rounding where the check on the tuning images fails",
    run=_run, needs=lambda cfg: ("sample", "graph", "calibrate") + (("aipp",) if _checks(cfg) else ()),
    key_inputs=_key_inputs, outputs=(QPARAMS_JSON, QPARAMS_NPZ, RECOVERY_JSON, RECOVERY_TXT))
