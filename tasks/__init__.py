"""The build's stages, one module each, in the order a build runs them: the one table the doit tasks, the
artifact keys, ``quantflow list`` and the build summary are made from (``quantflow.pipeline``).  Adding a stage
means adding a module with its ``STAGE`` (``stage.Stage``) and listing it here.

    preflight -> train (with [train]) -> sample -> graph -> calibrate -> aipp -> recover -> retrain (with [retrain])
              -> sensitivity (when used) -> fallback -> export -> atc
                          \\-> gate (runs the sensitivity analysis itself when it fails) -> summary
"""
from __future__ import annotations

from . import (aipp, atc, calibrate, export, fallback, gate, graph, preflight, recover, retrain, sample, sensitivity,
               summary, train)
from .stage import Stage

STAGES: dict[str, Stage] = {m.STAGE.name: m.STAGE for m in (
    preflight, train, sample, graph, calibrate, aipp, recover, retrain, sensitivity, fallback, export, atc, gate,
    summary)}
