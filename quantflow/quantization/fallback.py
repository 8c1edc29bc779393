"""Automatic float16 fallback (``quantization.fallback = "auto"``).

Starting from every op in INT8, the most sensitive op still in INT8 (``Sensitivity.ranking``) is
rolled back to float16 -- left out of the quantization parameters, so that the emulation and every
deploy graph keep it as a float op -- until the accuracy check passes or ``max_ops`` ops are in
float, in the manner of AMCT's accuracy-based auto calibration and NNCF's
quantize_with_accuracy_control.  Every step's accuracy is recorded.  Where the check names what fails
(a detector's failing heads), each next op is the most sensitive on that (``rerank``).

With ``settled`` (the build's: ``evaluation.intervals.settled``, every figure with a bootstrap interval) the
roll-back stops at the verdict the gate would pass on the tuning images.  Where that asks for a PASS and the check
is UNDECIDED -- its interval straddles the limit -- the next layer is rolled back only on trial (``closer``): kept
if the check comes closer to passing, else put back and the roll-back stops, for what is left is what the tuning
images cannot tell apart, not a layer (rolling layers back for noise would cost INT8 for nothing).
"""
from __future__ import annotations

from typing import Callable

from .qparams import QuantParams


def without(qparams: QuantParams, nodes) -> QuantParams:
    """``qparams`` with the ops of ``nodes`` left in float."""
    return qparams.without(nodes, "rolled back to float16 by the automatic fallback")


def roll_back(qparams: QuantParams, ranking: list[str], check: Callable[[QuantParams], dict],
              max_ops: int, fields: tuple[str, ...] = ("int8_top1", "drop"),
              rerank: Callable[[dict], list[str]] | None = None,
              settled: Callable[[dict], bool] | None = None,
              closer: Callable[[dict, dict], bool | None] | None = None,
              first: dict | None = None) -> tuple[QuantParams, list[dict]]:
    """(the selected parameters, the steps).  ``check(qparams)`` returns at least ``passed`` and ``fields``
    (the gate metric's step keys); each step records those with the ops in float at that point (and the check's
    ``verdict`` and ``undecided`` labels where it gives them).
    ``rerank(result)``, when given, is the ranking the next op is taken from after a failed check;
    ``settled(result)``, when given, says when to stop instead of ``passed`` (``evaluation.intervals.settled``);
    ``closer(result, before)``, when given, is None where the check before was a failure the roll-back must go
    on from, else whether ``result`` is closer to passing than ``before``: a step that is not is marked
    ``"undone": true``, its op put back, and the roll-back stops at the step before it.  ``first``, when given, is
    ``check(qparams)`` already made (the recovery's): step 0 takes it instead of checking again."""
    in_float: list[str] = []
    scopes = {q.node: q.scope for q in qparams.ops}
    steps = []
    candidates = [n for n in ranking if n in scopes]
    before = None
    while True:
        current = without(qparams, in_float)
        result = first if first is not None and not in_float else check(current)
        done = bool(settled(result) if settled else result["passed"])
        steps.append({"float_ops": [{"node": n, "scope": scopes[n]} for n in in_float],
                      "int8_ops": len(current.ops), **{k: result[k] for k in fields}, "passed": done,
                      **({k: result[k] for k in ("verdict", "undecided") if k in result})})
        if not done and before is not None and closer is not None and closer(result, before) is False:
            steps[-1]["undone"] = True
            in_float.pop()
            return without(qparams, in_float), steps
        if done or len(in_float) >= min(max_ops, len(candidates)):
            return current, steps
        before = result
        order = [n for n in rerank(result) if n in scopes] if rerank else candidates
        in_float.append(next(n for n in order + candidates if n not in in_float))
