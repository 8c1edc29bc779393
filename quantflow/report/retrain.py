"""The report's retraining section (``[retrain]``): the loss of every training step, and the INT8 network's loss
as the emulator computes it before and after (the retrain stage's ``retrain.json``)."""
from __future__ import annotations

import html

import numpy as np

from .plots import _figure, _png


def loss_curve(losses: list[float], before: float, retrained: float) -> bytes:
    """The training loss per step (log scale), with the emulated INT8 loss before and after as lines."""
    plt, (fig, ax) = _figure(6, 2.6)
    steps = np.arange(1, len(losses) + 1)
    ax.plot(steps, losses, linewidth=0.8, label="training loss (fake-quant network, one batch)")
    ax.axhline(before, color="red", linestyle="--", label="INT8 (emulated), calibration images: before")
    ax.axhline(retrained, color="green", linestyle="--", label="after")
    if min([*losses, before, retrained]) > 0:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7)
    return _png(plt, fig)


def section(record: dict) -> str:
    """``<section id="retrain">``: the settings, the time, the curve and which parameters were kept."""
    import base64

    e = record["emulated_loss"]
    png = base64.b64encode(loss_curve(record["losses"], e["before"], e["retrained"])).decode()
    kept = ("the retrained parameters are used" if record["kept"] == "retrained" else
            "no better than before: the parameters it started from are used")
    what = "weights and activation ranges" if record["learn_ranges"] else "weights (activation ranges frozen)"
    return (f'<section id="retrain"><h2>Retraining ({html.escape(record["mode"])})</h2>'
            f"<p>{record['steps']} steps of {record['int8_ops']} INT8 ops' {what}, lr {record['lr']}, on "
            f"{html.escape(record['device_target'])} in {record['seconds']:.1f} s. INT8 loss (emulated) on "
            f"{record['images']} calibration images: {e['before']:.4g} before, {e['retrained']:.4g} retrained; "
            f"{kept}.</p><img src=\"data:image/png;base64,{png}\" alt=\"retraining loss\"></section>")
