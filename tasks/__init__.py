"""The build's stages, one module each, in the order a build runs them: the one table the doit tasks, the
artifact keys, ``quantflow list`` and the build summary are made from (``quantflow.pipeline``).  Adding a stage
means adding a module with its ``STAGE`` (``stage.Stage``) and listing it here.

    preflight -> train (with [train]) -> sample -> graph -> calibrate -> aipp -> fallback -> export -> atc
                                                                                  \\-> gate -> summary
"""
from __future__ import annotations

from . import aipp, atc, calibrate, export, fallback, gate, graph, preflight, sample, summary, train
from .stage import Stage

STAGES: dict[str, Stage] = {m.STAGE.name: m.STAGE for m in (
    preflight, train, sample, graph, calibrate, aipp, fallback, export, atc, gate, summary)}
