"""The task metrics shipped with quantflow, by the name ``evaluation.metric`` gives them (each a class of
``task.py``'s class form, with per-image records and default limits)."""
from __future__ import annotations

SHIPPED: dict[str, str] = {
    "detection": "quantflow.evaluation.detection:Detection",            # YOLO-style detector heads
    "anchor_detection": "quantflow.evaluation.anchors:AnchorDetection",  # SSD, BlazeFace, RetinaFace-style heads
    "ctc": "quantflow.evaluation.ctc:CTC",                               # CTC sequence recognizers (OCR lines)
    "text_regions": "quantflow.evaluation.text_regions:TextRegions",    # DB-style text-detection maps
    "segmentation": "quantflow.evaluation.segmentation:Segmentation",   # per-pixel class scores, one-channel masks
}


def per_image(records: list) -> list:
    """The flat list of per-image records a shipped metric's ``summarize`` reads; a list of per-batch lists (the
    records as ``task.py`` collected them before per-image records) is flattened."""
    return [r for x in records for r in (x if isinstance(x, list) else [x])]
