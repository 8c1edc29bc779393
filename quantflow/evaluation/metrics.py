"""The accuracy gate's metrics (``evaluation.metric``), by name (the protocol: ``protocol.py``).

- ``top1`` (``top1.py``, classification): top-1 of the INT8 emulation against FP32 on per-class held-out
  folders (and top-5 beside it with 100 classes or more);
- ``outputs`` (``outputs.py``, detectors and other heads): the INT8 emulation against FP32 on every network
  output, or on each part of it ``evaluation.parts`` names;
- a task metric (``task.py``): a shipped one by name (``shipped.SHIPPED``: ``"detection"``,
  ``"anchor_detection"``, ``"ctc"``, ``"text_regions"``, ``"segmentation"``) or the user's own
  ``"module:callable"``, gated on the numbers it returns.
"""
from __future__ import annotations

from .outputs import Outputs
from .protocol import Metric
from .task import Task
from .top1 import Top1

METRICS: dict[str, Metric] = {m.name: m for m in (Top1(), Outputs(), Task())}


def metric(which) -> Metric:
    """The metric of ``evaluation.metric`` (a task metric for a shipped name or ``"module:callable"``), or that
    of an accuracy report (reports written before the metric was recorded are top-1)."""
    name = which if isinstance(which, str) else which.get("metric", "top1")
    return METRICS.get(name) or METRICS["task"]
