"""The report's plots, as PNG bytes (matplotlib, no display needed)."""
from __future__ import annotations

import io

import numpy as np


def _figure(width: float, height: float, **subplots):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt, plt.subplots(figsize=(width, height), dpi=100, **subplots)


def _png(plt, fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def sensitivity_chart(labels: list[str], output_db: list[float], alone_db: list[float],
                      first: str = "network output, this layer alone INT8") -> bytes:
    """Horizontal bars: per-layer SQNR (dB) of the network output (or of what ``first`` names: the part a
    failing gate ranks by) and of the layer's own output with that layer alone in INT8; most sensitive at the
    top; ``labels``: the layers' (short) names, as given."""
    plt, (fig, ax) = _figure(9, max(2.5, 0.32 * len(labels) + 1.2))
    y = np.arange(len(labels))
    cap = lambda v: [min(x, 99.0) for x in v]  # noqa: E731  (an exact layer has infinite SQNR)
    ax.barh(y - 0.2, cap(output_db), height=0.4, label=first)
    ax.barh(y + 0.2, cap(alone_db), height=0.4, label="this layer's output, alone INT8")
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_ylim(len(labels) - 0.5, -0.5)   # most sensitive at the top, no empty rows above or below
    ax.set_xlabel("SQNR (dB), lower = more sensitive")
    # above the plot, so that it covers no bar
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False)
    return _png(plt, fig)


def activation_histogram(title: str, hist: np.ndarray, lo: float, hi: float, clip: tuple[float, float]) -> bytes:
    """The calibration histogram of an op's input over [lo, hi] (log counts) with the chosen clip range.  The
    bars stand on a baseline below one count, so that an empty bin draws nothing and a bin of one count shows.
    Drawn as one filled step polygon: ``ax.stairs`` draws the same shape but walks its 2048 bins' path segments
    one by one to find the axes' limits, about 0.2 s a chart (five charts a report)."""
    plt, (fig, ax) = _figure(6, 2.6)
    edges = np.linspace(lo, hi, len(hist) + 1)
    floor = 0.5
    heights = np.maximum(np.asarray(hist, np.float64), floor)
    ax.fill_between(np.repeat(edges, 2)[1:-1], np.repeat(heights, 2), floor, alpha=0.6, linewidth=0)
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor)
    for x, name in zip(clip, ("clip min", "clip max")):
        ax.axvline(x, color="red", linestyle="--", linewidth=1)
        ax.text(x, ax.get_ylim()[1], f" {name} {x:.3g}", color="red", fontsize=7, va="top")
    ax.set_title(title, fontsize=8)
    ax.set_xlabel("activation value")
    return _png(plt, fig)


def step_chart(int8_ops: list[int], series) -> bytes:
    """A value after each fallback step (INT8 ops left under each step; ``series``: an
    ``evaluation.protocol.Series``) against the gate's limit and, when given, the FP32 reference."""
    plt, (fig, ax) = _figure(6, 2.6)
    steps = np.arange(len(series.values))
    ax.plot(steps, series.values, marker="o", label=series.label)
    if series.reference is not None:
        ax.axhline(series.reference, color="green", label=series.reference_label)
    ax.axhline(series.limit, color="red", linestyle="--", label="gate limit")
    ax.set_xticks(steps, [f"{s}\n({n} INT8)" for s, n in zip(steps, int8_ops)], fontsize=7)
    ax.set_xlabel("ops rolled back to float16")
    ax.set_ylabel(series.ylabel)
    ax.legend(fontsize=7)
    return _png(plt, fig)


def floor_chart(unit: str, float16: float, int8: float, low: float | None, high: float | None,
                curve: list[tuple[float, float]] = (), where: str = "tuning images") -> bytes:
    """Left: the task outcomes (``unit``) the float16-only path and INT8 change against FP32, INT8's bar with the
    ratio's interval drawn as float16's count times its ends.  Right, where the fallback walked a ``curve``
    ((INT8 share of the multiply-adds, changed outcomes) per kept step, on ``where``): the price of each step."""
    plt, (fig, axes) = _figure(9 if curve else 5, 2.8, ncols=2 if curve else 1, squeeze=False)
    axes = axes[0]
    ax = axes[0]
    ax.bar([0, 1], [float16, int8], color=["#4a8", "#c64"])
    if low is not None and high is not None:
        base = max(float16, 1.0)
        ax.errorbar([1], [int8], yerr=[[max(int8 - low * base, 0)], [max(high * base - int8, 0)]], color="k",
                    capsize=4, label="ratio's interval x float16's count")
        ax.legend(fontsize=7)
    ax.set_xticks([0, 1], ["float16 only", "INT8 build"])
    ax.set_ylabel(f"changed {unit} vs FP32", fontsize=8)
    if curve:
        share, changed = zip(*curve)
        axes[1].plot([s * 100 for s in share], changed, marker="o")
        axes[1].set_xlabel("INT8 share of multiply-adds (%)", fontsize=8)
        axes[1].set_ylabel(f"changed {unit} ({where})", fontsize=8)
        axes[1].invert_xaxis()
        axes[1].set_title("fallback: each kept step", fontsize=8)
    return _png(plt, fig)
