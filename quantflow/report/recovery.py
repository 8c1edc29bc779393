"""The build report's ``recovery`` section: what the recovery did (``tasks/recover.py``'s recovery.json) and every
INT8 op's output SQNR (dB, all ops in INT8, against FP32) before it and after each method."""
from __future__ import annotations

import html

from ..quantization.qparams import short_names
from ..quantization.recovery import layer_table
from ..quantization.recovery.measure import is_output_row


def _db(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def section(record: dict | None) -> str:
    """The section's HTML (an element with id ``recovery``); a sentence where the recovery was off or did not run."""
    out = ['<section id="recovery"><h2>Recovery</h2>']
    if not record or record.get("mode") == "off":
        out.append("<p>quantization.recover is off: the calibrated parameters are used as they are.</p></section>")
        return "".join(out)
    steps = record["steps"]
    check = record.get("check")
    if check:
        def said(c: dict) -> str:
            return c.get("verdict") or ("PASS" if c["passed"] else "FAIL")
        out.append(f"<p>Check on the {check.get('images', '')} tuning images before recovery: {said(check)}"
                   + (f"; after it: {said(record['check_after'])}" if record.get("check_after") else "") + ".</p>")
    for s in steps:
        n = s["notes"]
        what = (f"{len(n['pairs'])} pair(s) equalized" if s["method"] == "equalize" else n.get("summary", ""))
        out.append(f"<p>{html.escape(s['method'])}: {html.escape(what)}"
                   f"{'' if s['kept'] else _undone(s)}.</p>")
        if s["method"] == "equalize":
            alone = [a for a in n["left_alone"] if a["reason"] != "already balanced"]
            if alone:
                out.append("<p>Left alone: " + "; ".join(html.escape(f"{a['pair']} ({a['reason']})")
                                                         for a in alone) + ".</p>")
    if not record.get("before"):
        out.append("<p>No method changed the parameters.</p></section>")
        return "".join(out)
    rows = layer_table(record)
    cols = ["before"] + [f"{i}:{s['method']}" for i, s in enumerate(steps)]
    short = short_names([r["scope"] for r in rows if not is_output_row(r["node"])]
                        or ["-"])
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["layer", "before"] + [s["method"] for s in steps])
    body = "".join("<tr>" + f'<td title="{html.escape(r["scope"])}">{html.escape(short.get(r["scope"], r["scope"]))}'
                   "</td>" + "".join(f"<td>{_db(r[c])}</td>" for c in cols) + "</tr>" for r in rows)
    out.append(f"<p>Output SQNR (dB) of each INT8 layer with every layer in INT8, against FP32:</p>"
               f"<table><tr>{head}</tr>{body}</table></section>")
    return "".join(out)


def _undone(step: dict) -> str:
    """Why a method's result was not kept."""
    if step.get("undone_by") == "tuning check":
        return " (undone by the check on the tuning images: not nearer FP32 there, or worse)"
    if step.get("undone_by") == "recovery images":
        return " (undone: not nearer FP32 beyond their noise, image by image, on the recovery images it learned from)"
    return " (undone: it lowered the least output SQNR of what the gate compares)"
