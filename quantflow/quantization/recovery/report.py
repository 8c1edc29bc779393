"""The recovery record as text: one row per INT8 op, its output SQNR (all ops in INT8) before recovery and after
each method."""
from __future__ import annotations

from ..qparams import fit, short_names
from . import layer_table
from .measure import is_output_row


def _db(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def text_table(record: dict, top: int | None = None) -> str:
    """The record's table (``top``: the ops that gained most, and the network); what each method did below."""
    if not record.get("before"):
        return "recovery: no method changed the parameters" + "".join(
            f"\n  {s['method']}: {len(s['notes'].get('pairs', []))} pair(s) to equalize" if s["method"] == "equalize"
            else f"\n  {s['method']}: {s['notes'].get('summary', '')}" for s in record["steps"])
    rows = layer_table(record)
    cols = ["before"] + [f"{i}:{s['method']}" for i, s in enumerate(record["steps"])]
    heads = ["before"] + [s["method"] + ("" if s["kept"] else " (undone)") for s in record["steps"]]
    layers = [r for r in rows if not is_output_row(r["node"])]
    outputs = [r for r in rows if r not in layers]   # the network's row, then the compared regions'
    if top:
        def gain(r):
            vals = [r[c] for c in cols if r[c] is not None and r[c] != float("inf")]
            return -(vals[-1] - vals[0]) if len(vals) > 1 else 0.0
        layers = sorted(layers, key=gain)[:top]
    short = short_names([r["scope"] for r in rows if r not in outputs] or ["-"])
    width = min(40, max([len(short.get(r["scope"], r["scope"])) for r in layers + outputs]))
    lines = [f"output SQNR dB (every op in INT8) against FP32, before recovery and after each method"
             f"{f' (the {top} ops that gained most)' if top else ''}",
             f"  {'layer':<{width}} " + " ".join(f"{h:>18}" for h in heads)]
    for r in layers + outputs:
        name = short.get(r["scope"], r["scope"])
        lines.append(f"  {fit(name, width):<{width}} " + " ".join(f"{_db(r[c]):>18}" for c in cols))
    for s in record["steps"]:
        n = s["notes"]
        if s["method"] == "equalize":
            lines.append(f"equalize: {len(n['pairs'])} pair(s) rescaled"
                         + "".join(f"\n  {p['pair']}: channel range spread {p['range_spread_before']:.0f}x -> "
                                   f"{p['range_spread_after']:.0f}x" for p in n["pairs"])
                         + "".join(f"\n  left alone: {a['pair']}: {a['reason']}" for a in n["left_alone"]
                                   if a["reason"] != "already balanced"))
        elif n.get("summary"):
            lines.append(f"{s['method']}: {n['summary']}")
    return "\n".join(lines)
