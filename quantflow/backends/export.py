"""Export of the FP32 network: MindIR always, AIR when MindSpore's Ascend backend is available.

MindSpore refuses AIR export without the Ascend backend ("Only support export file in 'AIR'
format with Ascend backend"), so on a CPU-only machine the AIR step is a logged skip that
names the reason; the atc stage then reports its own skip.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def ascend_available() -> tuple[bool, str]:
    """(available, reason when not)."""
    try:
        import mindspore.hal as hal
        if hal.is_available("Ascend"):
            return True, ""
    except Exception as err:  # an import or driver error means no usable backend
        return False, f"MindSpore's Ascend backend could not be queried: {err}"
    import mindspore as ms
    return False, (f"MindSpore {ms.__version__} has no usable Ascend backend on this machine "
                   f"(AIR export needs it; MindIR is exported instead)")


def _export(net, input_shape, prefix: Path, fmt: str) -> Path:
    import mindspore as ms

    from ..io.atomic import atomic_path

    written = prefix.with_name(prefix.name + "." + fmt.lower())
    with atomic_path(written, in_folder=True) as tmp:
        ms.export(net, ms.Tensor(np.zeros(input_shape, np.float32)), file_name=str(tmp.with_suffix("")), file_format=fmt)
        if not tmp.is_file():
            raise RuntimeError(f"MindSpore reported no error but wrote no {written}")
    return written


def export_mindir(net, input_shape, path: Path | str) -> Path:
    """Write ``net`` as MINDIR to ``path`` (traced with a zero input of ``input_shape``)."""
    import mindspore as ms

    path = Path(path)
    ms.set_context(mode=ms.GRAPH_MODE)
    written = _export(net, input_shape, path.with_suffix(""), "MINDIR")
    if written != path:
        written.replace(path)
    return path


def export_air(net, input_shape, out_dir: Path, stem: str = "model") -> dict:
    """Write ``<stem>.air`` when possible; returns {"air": name or None, "air_skipped": reason or None}."""
    ok, reason = ascend_available()
    if not ok:
        return {"air": None, "air_skipped": reason}
    import mindspore as ms
    ms.set_context(device_target="Ascend")
    return {"air": _export(net, input_shape, Path(out_dir) / stem, "AIR").name, "air_skipped": None}
