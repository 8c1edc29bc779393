"""Automatic float16 fallback (``quantization.fallback = "auto"``).

Starting from every op in INT8, the most sensitive op still in INT8 (``Sensitivity.ranking``) is
rolled back to float16 -- left out of the quantization parameters, so that the emulation and every
deploy graph keep it as a float op -- until the accuracy check passes or ``max_ops`` ops are in
float, in the manner of AMCT's accuracy-based auto calibration and NNCF's
quantize_with_accuracy_control.  Every step's accuracy is recorded.  Where the check names what fails
(a detector's failing heads), each next op is the most sensitive on that (``rerank``).

With ``settled`` (the build's: ``evaluation.intervals.settled``, every figure with a bootstrap interval) the
roll-back stops at the verdict the gate would pass on the tuning images.  Every layer is rolled back on trial
(``improves``): kept if the check comes closer to passing, else put back (the step marked ``undone``) and the next
candidate tried, up to ``PATIENCE`` unhelpful trials in a row.  A layer whose roll-back did not help is never
kept: shipping it in float16 would cost INT8 for nothing, and several layers that each cost a little are still
found one by one.  With ``grow`` (a release that has priced the layers it will pay: ``evaluation.max_vs_float16``)
an unhelpful layer is not put back but stays on trial with the next: the walk goes down the ranking until the layers
tried since the last kept step help together, or ``max_ops`` are in float16; layers that never helped are not kept.
"""
from __future__ import annotations

from typing import Callable

from .qparams import QuantParams

PATIENCE = 3   # unhelpful trials in a row after which the roll-back stops


def without(qparams: QuantParams, nodes) -> QuantParams:
    """``qparams`` with the ops of ``nodes`` left in float."""
    return qparams.without(nodes, "rolled back to float16 by the automatic fallback")


def roll_back(qparams: QuantParams, ranking: list[str], check: Callable[[QuantParams], dict],
              max_ops: int, fields: tuple[str, ...] = ("int8_top1", "drop"),
              rerank: Callable[[dict], list[str]] | None = None,
              settled: Callable[[dict, int], bool] | None = None,
              improves: Callable[[dict, dict], bool] | None = None,
              first: dict | None = None, patience: int = PATIENCE,
              looks: int = 0, grow: bool = False) -> tuple[QuantParams, list[dict]]:
    """(the selected parameters, the steps).  ``check(qparams)`` returns at least ``passed`` and ``fields``
    (the gate metric's step keys); each step records those with the ops in float at that point (and the check's
    ``verdict``, ``undecided`` and ``steering`` where it gives them).
    ``rerank(result)``, when given, is the ranking the next op is taken from after a failed check;
    ``settled(result, looks)``, when given, says when to stop instead of ``passed`` (``evaluation.intervals.settled``),
    ``looks`` the checks of the same images made so far, this one among them (step i records it: stopping at the
    first of many checks to clear a margin favours noise, so the build's rule asks more of later ones);
    ``improves(result, before)``, when given, says whether the check with one more layer in float is better than
    the last kept one: a trial that neither settles nor improves is marked ``"undone": true`` and its op put back,
    and the roll-back stops after ``patience`` such trials in a row.  ``first``, when given, is ``check(qparams)``
    already made (the recovery's): step 0 takes it instead of checking again; ``looks``, the checks made before
    this roll-back (``first`` the last of them).  ``grow``: an unhelpful trial's layers stay in float16 for the next
    trial (that step marked ``"grows": true`` too) instead of being put back, and ``patience`` does not apply: the
    trials since the last kept step are kept together once they improve on it."""
    scopes = {q.node: q.scope for q in qparams.ops}
    candidates = [n for n in ranking if n in scopes]
    is_settled = (lambda r, n: bool(settled(r, n))) if settled else (lambda r, n: bool(r["passed"]))

    def step(in_float: list[str], result: dict, done: bool) -> dict:
        return {"float_ops": [{"node": n, "scope": scopes[n]} for n in in_float],
                "int8_ops": len(qparams.ops) - len(in_float), **{k: result[k] for k in fields}, "passed": done,
                "looks": looks, **({k: result[k] for k in ("verdict", "undecided", "steering", "distance")
                                    if k in result})}

    kept: list[str] = []
    pending: list[str] = []   # grow: layers tried since the last kept step, none of them helping yet
    rejected: set[str] = set()
    before = first if first is not None else check(qparams)
    looks = max(looks, 1) if first is not None else looks + 1
    done = is_settled(before, looks)
    steps = [step([], before, done)]
    misses = 0
    while not done and len(kept) + len(pending) < min(max_ops, len(candidates)) and (grow or misses < patience):
        order = [n for n in rerank(before) if n in scopes] if rerank else candidates
        nxt = next((n for n in order + candidates if n not in kept and n not in pending and n not in rejected), None)
        if nxt is None:
            break
        trial = kept + pending + [nxt]
        result = check(without(qparams, trial))
        looks += 1
        done = is_settled(result, looks)
        steps.append(step(trial, result, done))
        if done or improves is None or improves(result, before):
            kept, pending, before, misses = trial, [], result, 0
        else:
            steps[-1]["undone"] = True
            if grow:
                steps[-1]["grows"] = True
                pending.append(nxt)
            else:
                rejected.add(nxt)
            misses += 1
    return without(qparams, kept), steps
