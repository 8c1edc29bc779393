"""recover: the INT8 parameters brought closer to FP32 before the fallback may give any layer up to float16
(``quantflow.quantization.recovery``): ``qparams`` (with the recovered float weights), ``recovery.json`` (per INT8
op, its output SQNR with all ops in INT8, before recovery and after each method), ``recovery.txt``.

Where it checked the tuning images, the check of the parameters it saved is kept beside them (``TUNING_CHECK``,
the checker's report as JSON, its bootstrap draws beside it in ``TUNING_CHECK_DRAWS``; nothing a build writes is a
pickle, since artifacts cross machines through the cache): the fallback's step 0, on those same parameters and images, takes it instead
of checking again.

``quantization.recover``:

- ``"auto"``: where there are tuning images (``fallback.recovery_tuning_set``: the fallback's with ``fallback =
  "auto"``; with ``"off"`` the calibration images beyond the sample, at least ``MIN_TUNING_IMAGES`` of them, or
  ``evaluation.tune_dir``), the gate's check on them, then cross-layer equalization of every exact pair (guarded:
  undone where it lowers the least output SQNR of the regions the gate compares on the first
  ``quantization.recovery_images`` calibration images), output-aware ranges and learned rounding, one at a time,
  each checked there and kept by ``costly_kept`` (else the parameters before it, the step marked ``undone_by``):
  where the check passes, only where it brings INT8 nearer FP32 there (the distance to the float16 floor) and
  nearer beyond their noise, image by image, on the recovery images it learned from; where it fails, unless it
  harms there, before the fallback rolls any layer back (the check judged on the metric's own figures:
  ``evaluation.max_vs_float16`` is the fallback's to buy).  With no tuning images: equalization of the tensors
  INT8 starves only, guarded;
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
    """Does "auto" check the tuning images (and so run the costly methods), where the sample leaves it any
    (``fallback.recovery_tuning_set``)."""
    from .fallback import recovery_tuning_folder

    q = cfg.quantization
    return q.recover == "auto" and (q.fallback == "auto" or recovery_tuning_folder(cfg) is not None)


def recover_stage(cfg, kdir: Path, calibrate_dir: Path, graph_dir: Path, calibration_paths: list[Path],
                  aipp_dir: Path | None = None) -> dict:
    from quantflow.evaluation.floor import unpriced
    from quantflow.quantization.passes import fold_for_quantization
    from quantflow.quantization.recovery import CHEAP, COSTLY, Context, new_record, recover
    from quantflow.quantization.recovery.report import text_table

    from .fallback import MIN_TUNING_IMAGES, recovery_tuning_set, tuning_and_gate_sets, tuning_settled

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
    checks = _checks(cfg)   # "auto" and a folder to draw tuning images from
    tune = recovery_tuning_set(cfg) if checks else None
    if checks and tune is None:
        print(f"recovery: fewer than {MIN_TUNING_IMAGES} images of {cfg.calibration.data_dir} beyond the calibration "
              f"sample to check on: equalization of the tensors INT8 starves only (leave more of the folder out of "
              f"calibration.count, or give evaluation.tune_dir)")
    # with no tuning images to check it on, "auto" equalizes only the tensors INT8 starves (equalize.py)
    ctx = Context(graph, inputs, recalibrator(cfg, graph, calibration_paths), q.recovery_iterations,
                  auto=auto and tune is None, regions=compared_regions(cfg, graph))
    print(f"recovery ({'auto' if auto else ', '.join(q.recover)}) on "
          f"{len(calibration_paths[:q.recovery_images])} calibration images")
    if tune is None:
        qp, record = recover(ctx, qp, CHEAP if auto else q.recover, guard=auto)
    else:
        check = _tuning_check(cfg, raw, graph, aipp_dir, tune)
        first = last = check(qp)
        gate_images = len(tuning_and_gate_sets(cfg)[1])
        record = {**new_record(qp), "check": {"passed": bool(first["passed"]), "verdict": first["verdict"],
                                              "ops": len(qp.ops), "images": len(tune)}}
        own = unpriced(first)   # the recovery judges the metric's own figures, not the release's price
        fails = not tuning_settled(own, cfg.evaluation.on_undecided, gate_images, 1)
        mine = " on the metric's own figures" if own is not first else ""
        print(f"recovery: the check on {len(tune)} tuning images is {own['verdict']}{mine}; {', '.join(CHEAP + COSTLY)}, "
              "each " + ("kept unless it harms there, before any fallback" if fails else
                         "kept where it brings INT8 nearer FP32 there and on the recovery images, image by image"))
        # the cheap methods keep their guard (an equalization the recovery images call worse is not even checked)
        qp, record, last, made = costly_checked(
            qp, record, last, CHEAP + COSTLY,
            lambda name, p, r: recover(ctx, p, (name,), guard=name in CHEAP, record=r), check,
            cfg.evaluation.on_undecided)
        record["check_after"] = {**_said(last), "ops": len(qp.ops),
                                 "kept": any(st.get("kept") for st in record["steps"] if st.get("check"))}
        write_check(kdir, {**last, "looks": 1 + made})
    record["mode"] = "auto" if auto else "list"
    qp.save(kdir)
    write_json(kdir / RECOVERY_JSON, record)
    write_text(kdir / RECOVERY_TXT, text_table(record) + "\n")
    return record


def costly_checked(qp, record: dict, last: dict, methods, run, check, on_undecided: str):
    """(parameters, record, the check of those parameters, the checks made): the ``methods`` in order, each run
    (``run(name, qp, record)``: ``recovery.recover``, unguarded but for the cheap methods), checked on the tuning images (``check(qp)``)
    and kept by ``costly_kept`` against ``last`` (the check of the parameters it started from) and the recovery
    images' per-image SQNRs before and after it (``measure.nearer_per_image``, kept in the step as
    ``recovery_images``), else undone (its step marked ``undone_by``).  A method that changed nothing costs no
    check, nor one the recovery images do not show nearer where ``last`` passes (``costly_kept`` would undo it
    whatever the check said).  Every decision reads the checks on the metric's own figures
    (``floor.unpriced``): the price a release set (``evaluation.max_vs_float16``) is the fallback's to buy, so the
    recovery keeps the same methods with or without it (with it, its first check failing made the recovery keep
    methods unless they harmed: on ddddocr's YOLOX the walk started from 21 changed boxes where the default's
    parameters change 13)."""
    from quantflow.evaluation.floor import unpriced
    from quantflow.evaluation.steering import line as steering_line
    from quantflow.quantization.recovery import last_measurement
    from quantflow.quantization.recovery.measure import nearer_per_image

    from .fallback import tuning_settled

    made = 0
    for name in methods:
        before, measured = qp, last_measurement(record)
        qp, record = run(name, qp, record)
        if qp is before:
            continue
        # the first method that changes anything has the parameters before it measured just before it
        shown = nearer_per_image(measured or record.get("before"), record["steps"][-1].get("after"))
        if shown is not None:
            record["steps"][-1]["recovery_images"] = shown
        nearer = None if shown is None else shown["nearer"]
        settled = tuning_settled(unpriced(last), on_undecided)
        learned = settled and nearer is False
        if not learned:   # where the recovery images already say no, costly_kept needs no check to say it
            again = check(qp)
            made += 1
            record["steps"][-1]["check"] = _said(again)
            if costly_kept(unpriced(last), unpriced(again), on_undecided, nearer):
                last = again
                continue
        qp = before
        undo(record, len(record["steps"]) - 1, "recovery images" if learned else "tuning check")
        if learned:
            why = (f"not nearer FP32 beyond their noise on the recovery images it learned from ({shown['region']}: "
                   f"per-image SQNR {shown['change']:+.2f} dB on average, standard error {shown['se']:.2f}; not "
                   f"checked on the tuning images)")
        else:
            why = ("not nearer FP32 on the tuning images (" if settled else
                   "the check on the tuning images is worse (") + (
                f"{steering_line(last['steering'])} -> {steering_line(again['steering'])}"
                if last.get("steering") and again.get("steering") else f"{last['verdict']} -> {again['verdict']}") + ")"
        print(f"recovery: {name} is undone: {why}: the parameters before it are kept")
    return qp, record, last, made


def costly_kept(first: dict, again: dict, on_undecided: str, nearer: bool | None = None) -> bool:
    """Whether a recovery method's parameters (checked ``again`` on the tuning images) replace those it started
    from (checked ``first``).  Where ``first`` already gives the verdict the gate would pass, only where both
    image sets show it nearer FP32: the tuning images, which it did not learn from (``fallback.improves``: fewer
    changed outcomes beyond their noise, or the steering figure ``steering.MIN_GAIN`` better), and the recovery
    images it learned from (``nearer``: ``measure.nearer_per_image``, their per-image SQNRs higher beyond their
    noise on the region the parameters before it serve worst; None where not measured).  What it is for then is
    the distance to the float16 floor, and each alone misled on held-out images (docs/accuracy.md, "Methods
    against the float16 floor"): on ddddocr's YOLOX learned rounding lowered the tuning images' steering error
    9.7% and raised the recovery images' per-image SQNR on the objectness part by 1.0 dB, standard error 0.9, and
    changed 21 boxes on 480 held-out images against 13 (61 against 51 on 1920 others); on PP-LCNet the recovery
    images' pooled SQNR, half of whose noise one image near a decision carries, called it worse (33.05 -> 31.97
    dB) while their per-image SQNR rose 3.6 dB on average (standard error 1.5) and the held-out noise energy fell
    0.0816 -> 0.0374.
    Where ``first`` fails: unless the tuning images say it harms -- the parameters before it better by the
    fallback's own rule for a layer (``fallback.improves``: the steering figure at least ``steering.MIN_GAIN``
    lower) and ``again`` not a verdict the gate would pass.  Fitted to the recovery images alone, they can move
    INT8 away from FP32 on every other image: on the MobileNetV3-small example (calibration seeds 1-4) they raised
    the KL divergence on the tuning images from 0.0029-0.0067 to 0.0054-0.0094 nats.  A gain too small to show is
    no reason to undo them: where one collapsing layer dominates what the check fails on (a detector's scores part
    at 0.1 dB), only the fallback's roll-back of that layer lets their gain on the rest show."""
    from .fallback import improves, tuning_settled

    if tuning_settled(first, on_undecided):
        return improves(again, first) and nearer is not False
    return tuning_settled(again, on_undecided) or not improves(first, again)


def undo(record: dict, ran: int, by: str = "tuning check") -> None:
    """Marks the recovery's steps from index ``ran`` on as not kept, ``by`` what: ``"tuning check"`` (not nearer
    FP32 on the tuning images, or worse there) or ``"recovery images"`` (not nearer FP32 beyond their noise on
    those it learned from)."""
    for s in record["steps"][ran:]:
        if s["kept"]:
            s.update(kept=False, undone_by=by)


def _said(check: dict) -> dict:
    """What recovery.json keeps of a check of the tuning images: its verdict and steering figure."""
    return {"passed": bool(check["passed"]), "verdict": check["verdict"],
            **({"steering": _public(check["steering"])} if check.get("steering") else {})}


def _public(steering: dict) -> dict:
    """A steering figure as JSON holds it."""
    return {k: v for k, v in steering.items() if k in ("figure", "value", "flip_rate")}


def _tuning_check(cfg, raw, folded, aipp_dir, tune):
    """The gate's accuracy check on the tuning images ``tune`` (never the gate's); with the float16-only path's
    distance (``floor.checker``) only where something reads it: ``evaluation.max_vs_float16`` gates on it, and
    the automatic fallback takes this check as its step 0, whose curve shows it."""
    from quantflow.evaluation import floor
    from quantflow.evaluation.metrics import metric

    from .aipp import read_params

    args = (tune, cfg.evaluation, raw, folded, read_params(aipp_dir), output_names(cfg, raw))
    m = metric(cfg.evaluation.metric)
    if cfg.quantization.fallback == "off" and cfg.evaluation.max_vs_float16 is None:
        return m.checker(*args)
    return floor.checker(m, *args)


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
        from quantflow.data.images import IMAGE_EXTS
        from quantflow.io.digest import folder_digest

        from .fallback import evaluation_inputs, recovery_tuning_folder

        c = b.cfg.model_dump(mode="json")
        folder = recovery_tuning_folder(b.cfg)
        key.update(evaluation=c["evaluation"], **evaluation_inputs(b.cfg), normalization=c["normalization"],
                   num_classes=b.cfg.model.num_classes, fallback=q.fallback,
                   recovery_tune_data=folder_digest(b.cfg.path(folder), IMAGE_EXTS) if folder else None)
    return key


STAGE = Stage(
    name=NAME, doc="recovery before any fallback: cross-layer equalization; output-aware ranges and learned "
                   "rounding, each kept by the check on the tuning images",
    run=_run, needs=lambda cfg: ("sample", "graph", "calibrate") + (("aipp",) if _checks(cfg) else ()),
    key_inputs=_key_inputs, outputs=(QPARAMS_JSON, QPARAMS_NPZ, RECOVERY_JSON, RECOVERY_TXT))
