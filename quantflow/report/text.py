"""The accuracy report as text (the console and ``accuracy_report.txt``)."""
from __future__ import annotations

from ..evaluation.floor import distance_line
from ..evaluation.intervals import line
from ..evaluation.metrics import metric
from ..evaluation.steering import line as steering_line


def format_table(r: dict) -> str:
    """The report as text: where it was measured (and, after the automatic fallback, on which images it was tuned
    and its figure there), then the metric's own table."""
    verdict = "PASS" if r["passed"] else "FAIL"
    if r.get("verdict") and r["verdict"] != verdict:
        verdict = f"{verdict} ({r['verdict']}, evaluation.on_undecided = \"{r['on_undecided']}\")"
    head = [f"accuracy gate: {verdict}  ({r['images']} held-out images from {r.get('eval_data', '?')}, "
            f"calibration method {r.get('calibration_method', '?')}, {int8_ops(r)})"]
    if r.get("figures"):
        b = r["bootstrap"]
        head.append(f"  gated figures, each with its {b['confidence']:.0%} paired bootstrap interval over the held-out "
                    f"images ({b['resamples']} resamples, seed {b['seed']})"
                    + (f"; baseline {r['baseline']['path']}" if r.get("baseline") else "") + ":")
        head += [f"    {line(f)}" for f in r["figures"]]
    h = r.get("held_out")
    if h and h.get("tuning_images"):
        head.append(f"  the gate judged {len(h['images'])} images, the fallback tuned on {len(h['tuning_images'])} "
                    f"others ({h['tuning_source']}); accuracy_report.json held_out lists both")
    t = r.get("tuning")
    if t:
        head.append(f"  the fallback tuned on {t['images']} other images ({t['source']}): {t['figure']} "
                    f"({t.get('verdict', 'PASS' if t['passed'] else 'FAIL')} there); the gate's figures below are on "
                    f"images it did not see")
        if t.get("note"):
            head.append(f"  note: {t['note']}")
        if t.get("untellable"):
            head.append(f"  evaluation.max_vs_float16 could not be shown there: {t['untellable']}")
    if r.get("steering"):
        head.append(f"  steering figure (INT8 against FP32, what the fallback steers by): "
                    f"{steering_line(r['steering'])}")
    f16 = r.get("float16")
    if f16:
        head.append(f"  the float16 floor ({f16['what']}): {f16['figure']}")
    if distance_line(r):
        head.append(f"  {distance_line(r)}")
    for p in r.get("curve", []):
        head.append(f"    the fallback's step with {p['float16_layers']} layer(s) in float16: INT8 "
                    f"{p['int8_mac_share']:.1%} of the multiply-adds, {p['changed']:g} changed, {p['ratio']:.3g}x the "
                    f"floor ({p['verdict']})")
    if r.get("quantized_ops") == 0:
        head.append("  a float16-only build (no op in INT8): \"INT8\" below is the device's float16 path")
    if r.get("precision_note"):
        head.append(f"  note: {r['precision_note']}")
    if r.get("float16_layers"):
        head.append(f"  {len(r['float16_layers'])} quantizable layer(s) run in float16 on the device (the report and "
                    f"qparams.json say why)")
    return "\n".join(head + metric(r).table(r))


def int8_ops(r: dict) -> str:
    """"4 INT8 ops: 2 Conv2D, 2 MatMul" (the op types where the report holds them)."""
    types = r.get("int8_op_types")
    said = f"{r.get('quantized_ops', '?')} INT8 ops"
    return f"{said}: {', '.join(f'{n} {op}' for op, n in types.items())}" if types else said
