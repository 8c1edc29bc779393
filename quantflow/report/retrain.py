"""The report's retraining section (``[retrain]``): the loss of every training step, and the INT8 network's loss
as the emulator computes it before and after (the retrain stage's ``retrain.json``)."""
from __future__ import annotations

import html

import numpy as np

from .plots import _figure, _png


def loss_curve(losses: list[float], before: float, retrained: float, initial: float | None = None) -> bytes:
    """The training loss per step (log scale), with the emulated INT8 loss before, at the equalized start (where
    there is one) and after as lines."""
    plt, (fig, ax) = _figure(6, 2.6)
    steps = np.arange(1, len(losses) + 1)
    ax.plot(steps, losses, linewidth=0.8, label="training loss (fake-quant network, one batch)")
    ax.axhline(before, color="red", linestyle="--", label="INT8 (emulated): before")
    if initial is not None:
        ax.axhline(initial, color="orange", linestyle=":", label="at the equalized start")
    ax.axhline(retrained, color="green", linestyle="--", label="after")
    if min([*losses, before, retrained] + ([initial] if initial is not None else [])) > 0:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7)
    return _png(plt, fig)


def section(record: dict) -> str:
    """``<section id="retrain">``: the settings, the time, the curve and which parameters were kept."""
    import base64

    e, init = record["emulated_loss"], record.get("initial_scales")
    start = init["emulated_loss"] if init else None
    png = base64.b64encode(loss_curve(record["losses"], e["before"], e["retrained"], start)).decode()
    kept = {"retrained": "the retrained parameters are used",
            "equalized": "not better than its start beyond the images' sampling spread: the equalized parameters "
                         "are used",
            }.get(record["kept"], "not better beyond the images' sampling spread: the parameters it started from "
                                  "are used")
    gain = (record.get("gains") or {}).get("retrained")
    if gain:
        lo, hi = gain["interval"]
        against = {"started from": "the parameters it started from", "equalized": "the equalized start"}
        kept += (f" (loss lowered by {gain['gain']:.4g} [{lo:.4g}, {hi:.4g}] against "
                 f"{against.get(gain['against'], gain['against'])})")
    equalized = (f" The channel scales started at cross-layer equalization's ({len(init['pairs'])} pair(s) "
                 f"rescaled; INT8 loss {start:.4g})." if init else "")
    what = "weights and activation ranges" if record["learn_ranges"] else "weights (activation ranges frozen)"
    n_val = record.get("validation_images", 0)
    on = (f"{n_val} validation images (calibration images it did not learn from)" if n_val
          else f"{record['images']} calibration images")
    steps = record.get("checkpoints") or []
    at = (f" (step {record['retrained_step']}; at the checkpoints: "
          + ", ".join(f"{c['emulated_loss']:.4g} at {c['step']}" for c in steps) + ")") if len(steps) > 1 else ""
    return (f'<section id="retrain"><h2>Retraining ({html.escape(record["mode"])})</h2>'
            f"<p>{record['steps']} steps of {record['int8_ops']} INT8 ops' {what}, lr {record['lr']}, on "
            f"{html.escape(record['device_target'])} in {record['seconds']:.1f} s. INT8 loss (emulated) on "
            f"{on}: {e['before']:.4g} before, {e['retrained']:.4g} retrained{at}; "
            f"{kept}.{equalized}</p><img src=\"data:image/png;base64,{png}\" alt=\"retraining loss\"></section>")
