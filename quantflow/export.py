"""Stage 3: export the network: MindIR always, AIR when MindSpore's Ascend backend is available.

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


def export_models(net, input_shape, out_dir: Path, stem: str = "model") -> dict:
    """Write ``<stem>.mindir`` and, when possible, ``<stem>.air``; returns a status dict."""
    import mindspore as ms
    from mindspore import Tensor

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dummy = Tensor(np.zeros(input_shape, np.float32))
    prefix = out_dir / stem
    ms.export(net, dummy, file_name=str(prefix), file_format="MINDIR")
    mindir = prefix.with_suffix(".mindir")
    if not mindir.is_file():
        raise RuntimeError(f"MindSpore reported no error but wrote no {mindir}")
    status = {"mindir": mindir.name, "air": None, "air_skipped": None}
    ok, reason = ascend_available()
    if ok:
        ms.set_context(device_target="Ascend")
        ms.export(net, dummy, file_name=str(prefix), file_format="AIR")
        air = prefix.with_suffix(".air")
        if not air.is_file():
            raise RuntimeError(f"MindSpore reported no error but wrote no {air}")
        status["air"] = air.name
    else:
        status["air_skipped"] = reason
    return status
