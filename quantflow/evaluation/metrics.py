"""The accuracy gate's metrics (``evaluation.metric``), by name (the protocol: ``protocol.py``).

- ``top1`` (``top1.py``, classification): top-1 of the INT8 emulation against FP32 on per-class held-out
  folders;
- ``outputs`` (``outputs.py``, detectors and other heads): the INT8 emulation against FP32 on every network
  output.
"""
from __future__ import annotations

from .outputs import Outputs
from .protocol import Metric
from .top1 import Top1

METRICS: dict[str, Metric] = {m.name: m for m in (Top1(), Outputs())}


def metric(which) -> Metric:
    """The metric named ``which``, or that of an accuracy report (reports written before the metric was
    recorded are top-1)."""
    return METRICS[which if isinstance(which, str) else which.get("metric", "top1")]
