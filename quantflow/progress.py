"""Progress bars for the long stages (calibration, the gate): images/s on a terminal, silent otherwise."""
from __future__ import annotations

import sys


def progress(total: int | None, desc: str, unit: str = "img"):
    """A tqdm bar counting images (or ``unit``s: the retraining counts steps, its loss beside them); disabled
    when stderr is not a terminal (CI logs, doit capture)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not sys.stderr.isatty(), leave=False,
                dynamic_ncols=True)
