"""The gate's results for CI: JUnit XML (one test case per gated figure; a figure that FAILs, is worse than the
baseline, or is UNDECIDED under ``evaluation.on_undecided = "fail"`` is a failed case with its verdict line as the
message; UNDECIDED under "warn" / "pass" passes, its line in the case's output) and a Markdown summary for a CI
job summary (e.g. appended to ``$GITHUB_STEP_SUMMARY``)."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from ..evaluation.floor import distance_line
from ..evaluation.intervals import FAIL, UNDECIDED, line, number

SUITE = "quantflow.gate"


def failed(f: dict, on_undecided: str) -> bool:
    """Whether figure ``f`` fails the build."""
    return (f["verdict"] == FAIL or bool(f.get("baseline", {}).get("worse"))
            or (f["verdict"] == UNDECIDED and on_undecided == "fail"))


def junit(report: dict) -> str:
    """The JUnit XML of the gate's figures (module docstring)."""
    figures = [f for f in report.get("figures", []) if f.get("gated", True)]
    how = report.get("on_undecided", "fail")
    bad = [f for f in figures if failed(f, how)]
    suite = ET.Element("testsuite", name=SUITE, tests=str(len(figures)), failures=str(len(bad)), errors="0",
                       skipped="0")
    props = ET.SubElement(suite, "properties")
    for k, v in (("verdict", report.get("verdict", "")), ("images", report.get("images", "")),
                 ("confidence", report.get("bootstrap", {}).get("confidence", "")),
                 ("on_undecided", how), ("baseline", report.get("baseline", {}).get("path", ""))):
        ET.SubElement(props, "property", name=k, value=str(v))
    for f in figures:
        case = ET.SubElement(suite, "testcase", classname=f"{SUITE}.{report.get('metric', '')}", name=f["figure"])
        if failed(f, how):
            ET.SubElement(case, "failure", message=line(f), type=f["verdict"]).text = line(f)
        elif f["verdict"] == UNDECIDED:
            ET.SubElement(case, "system-out").text = f"{line(f)} (evaluation.on_undecided = {how!r})"
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def _cell(text) -> str:
    return str(text).replace("|", "\\|")


def markdown(report: dict, title: str = "quantflow accuracy gate") -> str:
    """The Markdown summary: the verdict, each gated figure with its interval, then every output's fidelity."""
    conf = report.get("bootstrap", {}).get("confidence", 0.95)
    lines = [f"## {title}: {report.get('verdict', 'PASS' if report.get('passed') else 'FAIL')}"
             f"{'' if report.get('passed') else ' (build fails)'}", "",
             f"{report.get('images', '?')} held-out images; intervals: {conf:.0%} paired bootstrap "
             f"({report.get('bootstrap', {}).get('resamples', '?')} resamples); UNDECIDED: "
             f"evaluation.on_undecided = \"{report.get('on_undecided', 'fail')}\""
             + (f"; baseline {report['baseline']['path']}" if report.get("baseline") else ""), "",
             "| figure | value | interval | limit | verdict | baseline |", "|---|---|---|---|---|---|"]
    for f in report.get("figures", []):
        iv = "" if f["low"] is None else f"[{number(f['low'])}, {number(f['high'])}]"
        verdict = f["verdict"] + (f" (about {f['decide_images']} images would decide it)" if f.get("decide_images")
                                  else "")
        b = f.get("baseline")
        base = "" if not b else f"{number(b['value'])}: {'WORSE' if b['worse'] else 'not worse'}"
        lines.append(f"| {_cell(f['figure'])} | {number(f['value'])} | {iv} | {'>=' if f['kind'] == 'min' else '<='} "
                     f"{f['limit']:g} | {verdict} | {_cell(base)} |")
    said = distance_line(report)
    if said:
        f16 = report.get("float16", {})
        lines += ["", f"Against the float16 floor (no op in INT8): {said}."
                  + (f" The float16-only path: {f16['figure']} ({f16['verdict']})." if f16 else "")]
    rows = report.get("outputs", [])
    if rows:
        lines += ["", "Fidelity of INT8 against FP32 (cosine, SQNR):", "",
                  "| output / part | cosine | interval | SQNR dB | interval |", "|---|---|---|---|---|"]
        for o in rows:
            ci, si = o.get("cosine_interval"), o.get("sqnr_db_interval")
            lines.append(f"| {_cell(o['part'] or o['output'])} | {o['cosine']:.5f} | "
                         f"{'' if not ci else f'[{ci[0]:.5f}, {ci[1]:.5f}]'} | {o['sqnr_db']:.1f} | "
                         f"{'' if not si else f'[{si[0]:.1f}, {si[1]:.1f}]'} |")
    return "\n".join(lines) + "\n"
