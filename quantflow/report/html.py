"""The build report as one self-contained HTML file (plots embedded as base64 PNG).

Sections (each an element with the id given): ``verdict``, ``per-class`` (top-1; ``per-output`` for the outputs
metric, ``quantflow.evaluation``), ``sensitivity``,
``histograms`` (the worst layers' calibration histograms with the chosen clip), ``fallback``.
"""
from __future__ import annotations

import base64
import html
from pathlib import Path

from ..evaluation.metrics import metric
from ..io.atomic import write_text
from . import plots

WORST_LAYERS = 5


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _table(head: list[str], rows: list[list]) -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{trs}</table>"


def render(title: str, gate: dict, sensitivity: dict, histograms: dict, fallback: dict | None) -> str:
    """``gate``: the accuracy report; ``sensitivity``: ``Sensitivity.as_dict()``; ``histograms``:
    node -> {"scope", "hist", "lo", "hi", "clip"} (may be empty: minmax collects none);
    ``fallback``: {"mode", "steps"} or None."""
    m = metric(gate)
    verdict = "PASS" if gate["passed"] else "FAIL"
    parts = [f"<h1>{html.escape(title)}</h1>",
             f'<section id="verdict"><h2>Verdict: <span class="{verdict.lower()}">{verdict}</span></h2>',
             _table(["", "value"], [["held-out images", gate["images"]]] + m.summary_rows(gate) + [
                 ["INT8 ops", gate.get("quantized_ops", "?")], ["range method", gate.get("calibration_method", "?")]]),
             "</section>"]
    section, heading, head, rows = m.details(gate)
    parts += [f'<section id="{section}"><h2>{heading}</h2>', _table(head, rows), "</section>"]
    rows = {r["node"]: r for r in sensitivity["ops"]}
    ranked = [rows[n] for n in sensitivity["ranking"]]
    parts += [f'<section id="sensitivity"><h2>Per-layer sensitivity ({sensitivity["images"]} calibration images)</h2>',
              "<p>SQNR and cosine similarity against FP32: the network output and the layer's own output with "
              "that layer alone in INT8, and the layer's output with every layer in INT8 (cumulative). Most "
              "sensitive first.</p>"]
    if ranked:
        parts.append(_img(plots.sensitivity_chart([r["scope"] for r in ranked],
                                                  [r["output"]["sqnr_db"] for r in ranked],
                                                  [r["alone"]["sqnr_db"] for r in ranked]), "per-layer sensitivity"))
    parts += [_table(["rank", "layer", "op", "range", "output SQNR dB", "output cosine", "alone SQNR dB",
                      "cumulative SQNR dB"],
                     [[i, r["scope"], r["op"], r.get("method", ""), f"{r['output']['sqnr_db']:.1f}",
                       f"{r['output']['cosine']:.5f}", f"{r['alone']['sqnr_db']:.1f}",
                       f"{r['cumulative']['sqnr_db']:.1f}"] for i, r in enumerate(ranked, 1)]),
              "</section>"]
    parts.append(f'<section id="histograms"><h2>Activation ranges of the {WORST_LAYERS} most sensitive layers</h2>')
    shown = [n for n in sensitivity["ranking"] if n in histograms][:WORST_LAYERS]
    if not shown:
        parts.append("<p>No histograms: the minmax method collects none (its clip is the observed range).</p>")
    for n in shown:
        h = histograms[n]
        parts.append(_img(plots.activation_histogram(f"input of ...{h['scope'][-60:]}", h["hist"], h["lo"], h["hi"],
                                                     h["clip"]), f"histogram {h['scope']}"))
    parts.append("</section>")
    parts.append('<section id="fallback"><h2>Float16 fallback</h2>')
    steps = (fallback or {}).get("steps", [])
    if not steps or (fallback or {}).get("mode") == "off":
        parts.append("<p>quantization.fallback is off: every quantizable layer not in quantization.skip is INT8.</p>")
    else:
        parts.append(_img(plots.step_chart([s["int8_ops"] for s in steps], m.steps_series(steps, gate)),
                          "fallback steps"))
        parts.append(_table(*m.steps_table(steps)))
    parts.append("</section>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;"
             "margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px}.pass{color:green}"
             ".fail{color:#b00}img{max-width:100%}")
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")


def write(path: Path, title: str, gate: dict, sensitivity: dict, histograms: dict, fallback: dict | None) -> Path:
    return write_text(path, render(title, gate, sensitivity, histograms, fallback))
