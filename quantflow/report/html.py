"""The build report as one self-contained HTML file (plots embedded as base64 PNG).

Sections (each an element with the id given): ``verdict`` (with the fallback's tuning figure beside the gate's
when the automatic fallback ran), ``floor`` (INT8 against the float16-only path, ``evaluation.floor``),
``per-class`` (top-1; ``per-output`` for the outputs metric and the task metrics, ``quantflow.evaluation``),
``sensitivity``, ``histograms`` (the worst layers' calibration histograms with the chosen clip), ``recovery``
(``report.recovery``), ``fallback``.  Layers are called by their short names (``qparams.short_names``: unique, the
block indices kept) in the charts and tables, with the full layer scope beside them in the tables and as the
tooltip.
"""
from __future__ import annotations

import base64
import html
from pathlib import Path

import numpy as np

from ..evaluation.floor import distance_line, own_failure
from ..evaluation.intervals import number
from ..evaluation.metrics import metric
from ..evaluation.outputs import rows_details
from ..evaluation.steering import line as steering_line
from ..io.atomic import write_text
from ..quantization.qparams import short_names
from ..quantization.sensitivity import figure, focus_label
from . import plots
from .text import int8_ops
from .recovery import section as recovery_section

WORST_LAYERS = 5


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _cell(c, tag: str = "td") -> str:
    """A table cell; a (text, tooltip) pair gets the tooltip as its title."""
    if isinstance(c, tuple):
        return f'<{tag} title="{html.escape(str(c[1]))}">{html.escape(str(c[0]))}</{tag}>'
    return f"<{tag}>{html.escape(str(c))}</{tag}>"


def _table(head: list[str], rows: list[list], cls: str = "") -> str:
    th = "".join(_cell(h, "th") for h in head)
    trs = "".join("<tr>" + "".join(_cell(c) for c in r) + "</tr>" for r in rows)
    return f"<table{f' class={chr(34)}{cls}{chr(34)}' if cls else ''}><tr>{th}</tr>{trs}</table>"


def _verdict_rows(m, gate: dict) -> list[list]:
    rows = [["held-out images", gate["images"]]] + m.summary_rows(gate)
    t = gate.get("tuning")
    if t:
        rows = [["held-out images", f"{gate['images']} (the gate's: none tuned on)"]] + m.summary_rows(gate) + [
            ["fallback tuned on", f"{t['images']} images: {t['source']}"],
            ["fallback's figure on them", f"{t['figure']} ({t.get('verdict', 'PASS' if t['passed'] else 'FAIL')})"]]
        if t.get("note"):
            rows.append(["note", t["note"]])
        if t.get("untellable"):
            rows.append(["evaluation.max_vs_float16 not shown there", t["untellable"]])
    if gate.get("steering"):
        rows.append(["steering figure (INT8 against FP32)", steering_line(gate["steering"])])
    f16 = gate.get("float16")
    if f16:
        rows.append(["float16 floor: no op in INT8", f"{f16['figure']} (overall {f16['verdict']})"])
    if distance_line(gate):
        rows.append(["INT8 against the float16 floor", distance_line(gate)])
    return rows + [["INT8 ops", int8_ops(gate).replace(" INT8 ops", "")],
                   ["range method", gate.get("calibration_method", "?")]]


def _interval(f: dict) -> str:
    """A figure's interval as a cell ("" where it has none)."""
    return "" if f["low"] is None else f"[{number(f['low'])}, {number(f['high'])}]"


def floor_section(gate: dict, fallback: dict | None) -> str:
    """The ``floor`` section: INT8 against the float16-only path on the same images (``evaluation.floor``): a chart
    of the outcomes each changes and, after the automatic fallback, the curve it walked (INT8 share of the
    multiply-adds against the outcomes changed: on the gate's images where the gate measured it, ``curve``, else on
    the tuning images), and the float16-only path's figures."""
    d, f16 = gate.get("distance"), gate.get("float16")
    if not d or not f16:
        return ""
    held = [(p["int8_mac_share"], p["changed"]) for p in gate.get("curve", []) if p.get("int8_mac_share") is not None]
    steps = [s for s in (fallback or {}).get("steps", []) if not s.get("undone") and s.get("distance")]
    curve = held or [(s["distance"]["int8_mac_share"], s["distance"]["int8_changed"]) for s in steps
                     if "int8_mac_share" in s["distance"]]
    where = "held-out images" if held else "tuning images"
    rows = [[f["figure"], number(f["value"]), _interval(f), f["verdict"]] for f in f16.get("figures", [])]
    return "".join([
        '<section id="floor"><h2>INT8 against the float16 floor</h2>',
        f"<p>{html.escape(distance_line(gate))}. The float16 floor: {html.escape(f16['what'])}.</p>",
        _img(plots.floor_chart(d["unit"], d["float16_changed"], d["int8_changed"], d["low"] if d["counted"] else None,
                               d["high"] if d["counted"] else None, curve, where), "INT8 against the float16 floor"),
        _table(["layers in float16", "INT8 share of multiply-adds", f"changed {d['unit']}", "ratio to float16",
                "interval", "verdict"],
               [[p["float16_layers"], f"{p['int8_mac_share']:.1%}", f"{p['changed']:g}", number(p["ratio"]),
                 _interval(p), p["verdict"]]
                for p in gate.get("curve", [])]) if gate.get("curve") else "",
        _table(["float16-only figure", "value", "interval", "verdict against the same limits"], rows) if rows else "",
        "</section>"])


def figure_rows(gate: dict) -> tuple[list[str], list[list]]:
    """(header, rows): each gated figure with its interval, limit, verdict (and the baseline's figure)."""
    conf = gate["bootstrap"]["confidence"]
    rows = []
    for f in gate["figures"]:
        b = f.get("baseline")
        rows.append([f["figure"], number(f["value"]), _interval(f), f"{'>=' if f['kind'] == 'min' else '<='} "
                     f"{f['limit']:g}", f["verdict"], f.get("decide_images") or "",
                     "" if not b else f"{number(b['value'])}: {'WORSE' if b['worse'] else 'not worse'} ({b['method']})"])
    return (["figure", "value", f"{conf:.0%} interval", "limit", "verdict", "images to decide", "baseline"], rows)


def _by_clipping(histograms: dict) -> list[str]:
    """The layers of ``histograms``, the largest share of calibration values outside the chosen clip first."""
    def clipped(h) -> float:
        edges = np.linspace(h["lo"], h["hi"], len(h["hist"]) + 1)
        centres, total = (edges[:-1] + edges[1:]) / 2, max(int(h["hist"].sum()), 1)
        lo, hi = h["clip"]
        return float(h["hist"][(centres < lo) | (centres > hi)].sum()) / total
    return sorted(histograms, key=lambda n: (-clipped(histograms[n]), n))


def render(title: str, gate: dict, sensitivity: dict | None, histograms: dict, fallback: dict | None,
           retrain: dict | None = None, recovery: dict | None = None) -> str:
    """``gate``: the accuracy report; ``sensitivity``: ``Sensitivity.as_dict()``, or None where the per-layer
    analysis did not run (the histograms shown are then those of the layers that clip the most); ``histograms``:
    node -> {"scope", "hist", "lo", "hi", "clip"} (may be empty: minmax collects none);
    ``fallback``: {"mode", "steps"} or None."""
    m = metric(gate)
    verdict = "PASS" if gate["passed"] else "FAIL"
    said = verdict if gate.get("verdict", verdict) == verdict else f"{verdict} ({gate['verdict']})"
    parts = [f"<h1>{html.escape(title)}</h1>",
             f'<section id="verdict"><h2>Verdict: <span class="{verdict.lower()}">{said}</span></h2>',
             _table(["", "value"], _verdict_rows(m, gate))]
    if gate.get("figures"):
        parts.append(_table(*figure_rows(gate)))
    failure = own_failure(m, gate)
    if failure:
        parts.append(f'<p class="fail">{html.escape(failure)}</p>')
    parts.append("</section>")
    parts.append(floor_section(gate, fallback))
    section, heading, head, rows = m.details(gate)
    parts += [f'<section id="{section}"><h2>{heading}</h2>', _table(head, rows), "</section>"]
    if section != "per-output" and gate.get("outputs"):
        parts += ['<section id="fidelity"><h2>Fidelity: INT8 against FP32 on the output (shown, not gated)</h2>',
                  _table(*rows_details(gate["outputs"])), "</section>"]
    if sensitivity is None:
        ranking, short = _by_clipping(histograms), short_names([h["scope"] for h in histograms.values()])
        parts += ['<section id="sensitivity"><h2>Per-layer sensitivity</h2>',
                  "<p>Not run: the gate passed, and nothing else in this build needs it (quantization.sensitivity "
                  "= \"auto\" runs it for fallback = \"auto\" and for a failing gate; \"always\" in every "
                  "build).</p></section>"]
        shown = ranking[:WORST_LAYERS]
        heading = (f"Activation ranges of the {len(shown)} layers that clip the most calibration values"
                   if len(shown) > 1 else "Activation range of the layer that clips the most calibration values")
    else:
        rows = {r["node"]: r for r in sensitivity["ops"]}
        ranked = [rows[n] for n in sensitivity["ranking"]]
        short = short_names([r["scope"] for r in sensitivity["ops"]] + [h["scope"] for h in histograms.values()])
        focus = sensitivity.get("focus") or {}
        what = focus_label(sensitivity)
        parts += [f'<section id="sensitivity"><h2>Per-layer sensitivity ({sensitivity["images"]} calibration '
                  f'images)</h2>',
                  "<p>SQNR and cosine similarity against FP32: the network output and the layer's own output with "
                  "that layer alone in INT8, and the layer's output with every layer in INT8 (cumulative). Most "
                  "sensitive first" + (f", ranked by what fails: the {html.escape(what)} with the layer alone in "
                                       f"INT8 (the order the fallback takes layers in)" if focus else "") + ".</p>"]
        if ranked:
            parts.append(_img(plots.sensitivity_chart(
                [short[r["scope"]] for r in ranked],
                [figure(r, focus.get("outputs"), focus.get("parts")) for r in ranked],
                [r["alone"]["sqnr_db"] for r in ranked], first=f"{what}, this layer alone INT8"),
                "per-layer sensitivity"))
        ranked_by = [f"{what} SQNR dB"] if focus else []
        parts += [_table(["rank", "layer", "op", "range", *ranked_by, "output SQNR dB", "output cosine",
                          "alone SQNR dB", "cumulative SQNR dB", "full layer name"],
                         [[i, (short[r["scope"]], r["scope"]), r["op"], r.get("method", ""),
                           *([f"{figure(r, focus.get('outputs'), focus.get('parts')):.1f}"] if focus else []),
                           f"{r['output']['sqnr_db']:.1f}", f"{r['output']['cosine']:.5f}",
                           f"{r['alone']['sqnr_db']:.1f}", f"{r['cumulative']['sqnr_db']:.1f}", r["scope"]]
                          for i, r in enumerate(ranked, 1)], "layers"),
                  "</section>"]
        shown = [n for n in sensitivity["ranking"] if n in histograms][:WORST_LAYERS]
        heading = (f"Activation ranges of the {len(shown)} most sensitive layers" if len(shown) > 1
                   else "Activation range of the most sensitive layer")
    if not shown:
        heading = "Activation ranges"
    parts.append(f'<section id="histograms"><h2>{heading}</h2>')
    if not shown:
        parts.append("<p>No histograms: the minmax method collects none (its clip is the observed range).</p>")
    for n in shown:
        h = histograms[n]
        parts.append(_img(plots.activation_histogram(f"input of {short[h['scope']]}", h["hist"], h["lo"], h["hi"],
                                                     h["clip"]), f"histogram {h['scope']}"))
    parts.append("</section>")
    layers = gate.get("float16_layers", [])
    parts.append('<section id="device"><h2>Precision on the device</h2>')
    note = f"<p>{html.escape(gate['precision_note'])}.</p>" if gate.get("precision_note") else ""
    parts.append(f"<p>{gate.get('quantized_ops', '?')} layers run in INT8; {len(layers)} quantizable layer(s) in "
                 f"float16:</p>{note}" + (_table(["layer", "op", "why"], [[x["layer"], x["op"], x["reason"]]
                                                                         for x in layers]) if layers else ""))
    parts.append("</section>")
    parts.append(recovery_section(recovery))
    if retrain:  # retrain.json (quantflow.report.retrain)
        from .retrain import section
        parts.append(section(retrain))
    parts.append('<section id="fallback"><h2>Float16 fallback</h2>')
    steps = (fallback or {}).get("steps", [])
    if not steps or (fallback or {}).get("mode") == "off":
        parts.append("<p>quantization.fallback is off: every quantizable layer not in quantization.skip is INT8.</p>")
    else:
        t = (fallback or {}).get("tuning")
        if t:
            parts.append(f"<p>Tuned on {t['images']} images ({html.escape(t['source'])}); the gate judged "
                         f"{gate['images']} others.</p>")
        parts.append(_img(plots.step_chart([s["int8_ops"] for s in steps], m.steps_series(steps, gate)),
                          "fallback steps"))
        head, rows = m.steps_table(steps)
        for row, st in zip(rows, steps):   # column 1: the layers in float16 at that step
            if st.get("grows"):
                row[1] = f"{row[1]} (tried: no closer to passing yet, its last layer on trial with the next)"
            elif st.get("undone"):
                row[1] = f"{row[1]} (tried: no closer to passing, its last layer put back)"
        if any(st.get("steering") for st in steps):   # what the fallback steered by (evaluation.steering)
            head = [*head, "steering figure"]
            rows = [[*row, steering_line(st["steering"]) if st.get("steering") else ""] for row, st in zip(rows, steps)]
        parts.append(_table(head, rows))
    parts.append("</section>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;"
             "margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px}.pass{color:green}"
             ".fail{color:#b00}img{max-width:100%}table.layers td:last-child{color:#777;font-size:10px;"
             "word-break:break-all}")
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")


def write(path: Path, title: str, gate: dict, sensitivity: dict | None, histograms: dict, fallback: dict | None,
          retrain: dict | None = None, recovery: dict | None = None) -> Path:
    return write_text(path, render(title, gate, sensitivity, histograms, fallback, retrain, recovery))
