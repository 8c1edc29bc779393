"""The HTML build report and its plots."""
from __future__ import annotations

import base64
import math
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import cv2
import numpy as np
import pytest

from quantflow.evaluation.metrics import metric
from quantflow.evaluation.top1 import compare
from quantflow.quantization.fallback import roll_back
from quantflow.quantization.qparams import QuantizedOp, QuantParams, fit, short_names
from quantflow.report import plots
from quantflow.report.html import WORST_LAYERS, render, write

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SECTIONS = ["verdict", "per-class", "sensitivity", "histograms", "device", "recovery", "fallback"]


class Report(HTMLParser):
    """Each <section id=...>: its text, its <img> attributes and its table rows (cell texts)."""

    def __init__(self, text: str):
        super().__init__()
        self.sections: dict[str, dict] = {}
        self.section_ids: list[str] = []
        self.title = ""
        self._section = None
        self._in_title = False
        self._row = None
        self._cell = None
        self.images_outside = 0
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self._section = {"text": [], "imgs": [], "rows": []}
            self.sections[a["id"]] = self._section
            self.section_ids.append(a["id"])
        elif tag == "title":
            self._in_title = True
        elif tag == "img":
            if self._section is None:
                self.images_outside += 1
            else:
                self._section["imgs"].append(a)
        elif tag == "tr" and self._section is not None:
            self._row = []
            self._section["rows"].append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "section":
            self._section = None
        elif tag == "title":
            self._in_title = False
        elif tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        if self._section is not None:
            self._section["text"].append(data)
        if self._cell is not None:
            self._cell.append(data)

    def text(self, section: str) -> str:
        return " ".join("".join(self.sections[section]["text"]).split())


def decode_png(src: str) -> np.ndarray:
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix)
    data = base64.b64decode(src[len(prefix):], validate=True)
    return decode_bytes(data)


def decode_bytes(data: bytes) -> np.ndarray:
    assert data.startswith(PNG_SIGNATURE)
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert img is not None and img.size > 0 and img.shape[0] > 50 and img.shape[1] > 50
    return img


def has_colour(img: np.ndarray, bgr: tuple[int, int, int], tol: int = 60) -> bool:
    return bool(np.any(np.all(np.abs(img.astype(int) - np.array(bgr)) <= tol, axis=-1)))


RED = (0, 0, 255)

# ---------------------------------------------------------------------------------------- synthetic inputs
LABELS = np.array([0, 0, 1, 1, 2, 2, 2, 2])


def gate_report(threshold=0.2) -> dict:
    """8 held-out images in 3 classes; FP32 all right, INT8 gets one of class 1's two wrong."""
    fp = np.eye(3)[LABELS] * 3.0
    q = fp.copy()
    q[3] = [0.0, 1.0, 2.0]
    r = compare(fp, q, LABELS, threshold)
    r["calibration_method"], r["quantized_ops"] = "kl", 7
    return r


N_OPS = 7


def sensitivity() -> dict:
    """Seven ops; the sensitivity of op i falls with i (op 6 most sensitive); op 0 is exact."""
    ops = []
    for i in range(N_OPS):
        out = math.inf if i == 0 else 10.0 + 5.0 * (N_OPS - i)
        ops.append({"node": f"node{i}", "scope": f"Default/block{i}-Cell/Conv2D-op{i}",
                    "op": "Conv2D" if i < 6 else "MatMul", "method": "kl",
                    "alone": {"sqnr_db": out + 3.0, "cosine": 0.999},
                    "output": {"sqnr_db": out, "cosine": 1.0 if i == 0 else 0.99 - 0.01 * i},
                    "cumulative": {"sqnr_db": 20.0 + i, "cosine": 0.98}})
    ranking = [r["node"] for r in sorted(ops, key=lambda r: (r["output"]["sqnr_db"], r["node"]))]
    return {"images": 64, "ranking": ranking, "ops": ops}


def histograms(nodes) -> dict:
    rng = np.random.default_rng(0)
    out = {}
    for n in nodes:
        i = int(n[4:])
        hist = np.histogram(rng.normal(size=5000), bins=128, range=(-4.0, 4.0))[0]
        out[n] = {"scope": f"Default/block{i}-Cell/Conv2D-op{i}", "hist": hist, "lo": -4.0, "hi": 4.0,
                  "clip": (-2.5, 2.5)}
    return out


def fallback_record() -> dict:
    """roll_back's own record: node6, then node5 rolled back to float16, passing at the third step."""
    ops = [QuantizedOp(node=f"node{i}", scope=f"Default/block{i}-Cell/Conv2D-op{i}", op="Conv2D", input=f"t{i}",
                       scale_d=0.1, offset_d=0, scale_w=np.ones(1), channel_axis=0,
                       weight=np.ones((1, 1, 1, 1), np.int8), bias=np.zeros(1, np.int32),
                       deq_scale=np.ones(1, np.float32)) for i in range(N_OPS)]

    def check(qp):
        int8 = {q.node for q in qp.ops}
        top1 = 0.9 - 0.05 * len(int8 & {"node6", "node5"})
        return {"passed": top1 >= 0.9, "int8_top1": top1, "drop": 0.9 - top1}

    _, steps = roll_back(QuantParams("kl", ops), sensitivity()["ranking"], check, max_ops=3)
    return {"mode": "auto", "steps": steps}


@pytest.fixture(scope="module")
def full_report() -> Report:
    sens = sensitivity()
    return Report(render("resnet <INT8> & co", gate_report(), sens, histograms(sens["ranking"]), fallback_record()))


# ---------------------------------------------------------------------------------------- the report
def test_every_section_is_present_once(full_report):
    assert full_report.section_ids == SECTIONS
    assert full_report.images_outside == 0
    assert full_report.title == "resnet <INT8> & co"   # escaped in the HTML, the same text once parsed


def test_title_is_escaped():
    text = render("<script>x</script>", gate_report(), sensitivity(), {}, None)
    assert "<script>" not in text and "&lt;script&gt;" in text


def test_verdict_pass_and_its_figures(full_report):
    text = full_report.text("verdict")
    assert "Verdict: PASS" in text and "FAIL" not in text
    cells = {r[0]: r[1] for r in full_report.sections["verdict"]["rows"][1:]}
    assert cells["held-out images"] == "8"
    assert cells["FP32 top-1"] == "100.00%" and cells["INT8 top-1"] == "87.50%"
    assert cells["drop (points)"] == "+12.50" and cells["allowed drop (points)"] == "20.00"
    assert cells["top-1 agreement"] == "87.50%"
    assert cells["INT8 ops"] == "7" and cells["range method"] == "kl"


def test_verdict_fail():
    rep = Report(render("m", gate_report(threshold=0.05), sensitivity(), {}, None))
    assert "Verdict: FAIL" in rep.text("verdict") and "PASS" not in rep.text("verdict")


def test_per_class_table(full_report):
    rows = full_report.sections["per-class"]["rows"]
    assert rows[0] == ["class", "images", "FP32", "INT8", "drop (points)"]
    assert rows[1:] == [["0", "2", "100.00%", "100.00%", "+0.00"],
                        ["1", "2", "100.00%", "50.00%", "+50.00"],
                        ["2", "4", "100.00%", "100.00%", "+0.00"]]


def test_every_image_is_an_embedded_png(full_report):
    imgs = [i for s in full_report.sections.values() for i in s["imgs"]]
    # the sensitivity chart, the histograms of the five most sensitive layers, the fallback chart
    assert len(imgs) == 1 + WORST_LAYERS + 1
    for img in imgs:
        decode_png(img["src"])
        assert img["alt"]


def test_sensitivity_section_ranks_most_sensitive_first(full_report):
    sec = full_report.sections["sensitivity"]
    assert "64 calibration images" in full_report.text("sensitivity")
    assert len(sec["imgs"]) == 1 and sec["imgs"][0]["alt"] == "per-layer sensitivity"
    chart = decode_png(sec["imgs"][0]["src"])
    assert chart.shape[1] == 900     # 9 inches at 100 dpi
    rows = sec["rows"]
    assert rows[0][:2] == ["rank", "layer"] and rows[0][-1] == "full layer name" and len(rows) == 1 + N_OPS
    # ranked by output SQNR, lowest first: node6 (15 dB) ... node1 (40 dB), then the exact node0 (inf); each by
    # its short name, its full scope beside it
    order = [6, 5, 4, 3, 2, 1, 0]
    assert [r[1] for r in rows[1:]] == [f"block{i}" for i in order]
    assert [r[-1] for r in rows[1:]] == [f"Default/block{i}-Cell/Conv2D-op{i}" for i in order]
    assert [r[0] for r in rows[1:]] == [str(i) for i in range(1, N_OPS + 1)]
    assert rows[1][2:6] == ["MatMul", "kl", "15.0", "0.93000"]
    assert rows[-1][4] == "inf" and rows[-1][6] == "inf"


def test_histograms_of_the_worst_layers_only(full_report):
    sec = full_report.sections["histograms"]
    assert [i["alt"] for i in sec["imgs"]] == [f"histogram Default/block{i}-Cell/Conv2D-op{i}" for i in [6, 5, 4, 3, 2]]
    for img in sec["imgs"]:
        assert has_colour(decode_png(img["src"]), RED)   # the clip lines
    assert "No histograms" not in full_report.text("histograms")


def test_histograms_follow_the_ranking_and_skip_layers_without_one():
    sens = sensitivity()
    hist = histograms(["node0", "node4", "node6"])   # e.g. the other layers' method is minmax
    hist["not-ranked"] = dict(hist["node4"], scope="Default/elsewhere")
    rep = Report(render("m", gate_report(), sens, hist, None))
    assert [i["alt"] for i in rep.sections["histograms"]["imgs"]] == [
        "histogram Default/block6-Cell/Conv2D-op6", "histogram Default/block4-Cell/Conv2D-op4",
        "histogram Default/block0-Cell/Conv2D-op0"]


def test_without_the_analysis_the_histograms_are_those_that_clip_the_most():
    """A passing build that did not run the per-layer analysis (quantization.sensitivity = "auto"): the section
    says so, and the histograms shown are the layers whose chosen clip leaves out the largest share of values."""
    hist = histograms([f"node{i}" for i in range(N_OPS)])
    for i, n in enumerate(hist):   # node i clips at +-(0.5 + 0.5 i): node0 clips the most, node6 the least
        hist[n]["clip"] = (-0.5 - 0.5 * i, 0.5 + 0.5 * i)
    rep = Report(render("m", gate_report(), None, hist, None))
    assert "Not run: the gate passed" in rep.text("sensitivity") and not rep.sections["sensitivity"]["imgs"]
    assert rep.sections["sensitivity"]["rows"] == []
    assert "5 layers that clip the most calibration values" in rep.text("histograms")
    assert [i["alt"] for i in rep.sections["histograms"]["imgs"]] == [
        f"histogram Default/block{i}-Cell/Conv2D-op{i}" for i in range(5)]
    assert "No histograms" in Report(render("m", gate_report(), None, {}, None)).text("histograms")


def test_minmax_collects_no_histograms():
    rep = Report(render("m", gate_report(), sensitivity(), {}, None))
    assert rep.sections["histograms"]["imgs"] == []
    assert "No histograms: the minmax method collects none" in rep.text("histograms")


def test_fallback_section_names_the_rolled_back_layers(full_report):
    fb = fallback_record()
    assert [[f["node"] for f in s["float_ops"]] for s in fb["steps"]] == [[], ["node6"], ["node6", "node5"]]
    sec = full_report.sections["fallback"]
    assert len(sec["imgs"]) == 1 and sec["imgs"][0]["alt"] == "fallback steps"
    chart = decode_png(sec["imgs"][0]["src"])
    assert has_colour(chart, RED)          # the gate limit
    rows = sec["rows"]
    assert rows[0] == ["step", "layers in float16", "INT8 ops", "INT8 top-1", "drop (points)", "passed"]
    assert rows[1:] == [
        ["0", "(none)", "7", "80.00%", "+10.00", "False"],
        ["1", "Default/block6-Cell/Conv2D-op6", "6", "85.00%", "+5.00", "False"],  # the fallback names in full
        ["2", "Default/block6-Cell/Conv2D-op6, Default/block5-Cell/Conv2D-op5", "5", "90.00%", "+0.00", "True"]]
    assert "fallback is off" not in full_report.text("fallback")


def test_a_step_put_back_is_marked_and_the_tuning_figure_is_the_kept_steps(tmp_path):
    """A trial step past an UNDECIDED check that came no closer (``"undone"``) shows as tried and put back; the
    gate's tuning figure is that of the step whose parameters the fallback kept, not the last one tried."""
    from tasks.gate import _tuning

    fb = fallback_record()
    steps = [dict(s) for s in fb["steps"]] + [dict(fb["steps"][-1], undone=True, passed=False, int8_top1=0.8,
                                                   drop=0.1)]
    rep = Report(render("m", gate_report(), sensitivity(), {}, {"mode": "auto", "steps": steps}))
    rows = rep.sections["fallback"]["rows"]
    assert rows[3][1].startswith("Default/block6") and "put back" not in rows[3][1]
    assert rows[4][1].endswith("(tried: no closer to passing, its last layer put back)")
    grown = steps[:-1] + [dict(steps[-1], grows=True)]   # a release pricing the distance: kept on trial instead
    rows = Report(render("m", gate_report(), sensitivity(), {}, {"mode": "auto", "steps": grown})).sections[
        "fallback"]["rows"]
    assert rows[4][1].endswith("(tried: no closer to passing yet, its last layer on trial with the next)")
    cfg = type("Cfg", (), {"path": staticmethod(lambda p: tmp_path / p), "evaluation": type("E", (), {
        "tune_dir": None, "tune_from": "held_out", "metric": "top1"})()})()
    record = {"mode": "auto", "metric": "top1", "steps": steps, "tuning": {"source": "s", "images": 3, "names": []}}
    held = type("Ev", (), {"paths": []})()
    t = _tuning(cfg, record, held)
    assert t["passed"] is True and t["verdict"] == "PASS" and t["figure"].startswith("INT8 top-1 0.9000")


@pytest.mark.parametrize("fallback", [None, {"mode": "off", "steps": []}, {"mode": "auto", "steps": []},
                                      {"mode": "off", "steps": fallback_record()["steps"]}])
def test_fallback_off(fallback):
    rep = Report(render("m", gate_report(), sensitivity(), {}, fallback))
    assert "quantization.fallback is off" in rep.text("fallback")
    assert rep.sections["fallback"]["imgs"] == [] and rep.sections["fallback"]["rows"] == []
    assert "Default/block6-Cell" not in rep.text("fallback")


def test_an_empty_sensitivity_renders_without_a_chart():
    rep = Report(render("m", gate_report(), {"images": 0, "ranking": [], "ops": []}, {}, None))
    assert list(rep.sections) == SECTIONS
    assert rep.sections["sensitivity"]["imgs"] == [] and len(rep.sections["sensitivity"]["rows"]) == 1


def test_write_writes_the_rendered_report(tmp_path):
    sens = sensitivity()
    args = ("t", gate_report(), sens, histograms(sens["ranking"][:2]), fallback_record())
    path = write(tmp_path / "report.html", *args)
    assert path == tmp_path / "report.html"
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    # the same document as render (the PNG bytes are deterministic for the same inputs)
    rep, again = Report(text), Report(render(*args))
    assert list(rep.sections) == SECTIONS
    assert {k: rep.text(k) for k in SECTIONS} == {k: again.text(k) for k in SECTIONS}
    assert len([i for s in rep.sections.values() for i in s["imgs"]]) == 1 + 2 + 1


# ---------------------------------------------------------------------------------------- plots
def test_sensitivity_chart_is_a_png_and_copes_with_infinite_sqnr():
    img = decode_bytes(plots.sensitivity_chart(["a/very/long/" * 10 + "layer", "b"], [12.0, math.inf], [30.0, 50.0]))
    assert img.shape[1] == 900
    # one row per layer: more layers, a taller chart
    tall = decode_bytes(plots.sensitivity_chart([f"l{i}" for i in range(40)], [10.0] * 40, [20.0] * 40))
    assert tall.shape[0] > img.shape[0]


def test_activation_histogram_draws_the_clip_and_copes_with_empty_bins():
    hist = np.zeros(64, np.int64)
    hist[20:40] = np.arange(20) ** 2
    png = plots.activation_histogram("input of " + "x" * 100, hist, 0.0, 6.0, (0.0, 4.5))
    img = decode_bytes(png)
    assert img.shape[:2] == (260, 600)
    assert has_colour(img, RED)
    assert has_colour(img, (210, 173, 121), tol=40)   # the bars: matplotlib's first colour at alpha 0.6 on white


def test_fallback_steps_plot():
    steps = [{"int8_ops": n, "int8_top1": t} for n, t in ((10, 0.5), (9, 0.7), (8, 0.8))]
    series = metric("top1").steps_series(steps, {"fp32_top1": 0.82, "threshold": 0.03})
    assert series.values == [50.0, 70.0, 80.0] and series.limit == pytest.approx(79.0) and series.reference == 82.0
    img = decode_bytes(plots.step_chart([10, 9, 8], series))
    assert img.shape[:2] == (260, 600)
    assert has_colour(img, RED) and has_colour(img, (0, 128, 0))   # the gate limit and the FP32 line
    decode_bytes(plots.step_chart([3], metric("top1").steps_series(steps[:1], {"fp32_top1": 0.9, "threshold": 0.0})))


# ---------------------------------------------------------------------------------------- readable layer names
MBV2 = (["Default/features-SequentialCell/0-SequentialCell/0-Conv2d/Conv2D-op0"]
        + [f"Default/features-SequentialCell/{b}-InvertedResidual/block-SequentialCell/{k}-SequentialCell/0-Conv2d/"
           f"Conv2D-op0" for b in range(1, 6) for k in range(3)]
        + ["Default/features-SequentialCell/6-SequentialCell/0-Conv2d/Conv2D-op0", "Default/classifier-Dense/MatMul-op0"])


def test_short_names_are_unique_and_keep_the_block_index():
    short = short_names(MBV2)
    assert len(set(short.values())) == len(MBV2) == 18
    assert short[MBV2[0]] == "features.0.0" and short[MBV2[1]] == "features.1.block.0.0"
    assert short[MBV2[15]] == "features.5.block.2.0" and short[MBV2[-1]] == "classifier"
    # the former display, the last 48 characters: five MobileNetV2 layers read alike
    assert len({s[-48:] for s in MBV2}) < len(MBV2)
    onnx_names = ["/model.0/conv/Conv", "/model.2/m.0/cv1/conv/Conv", "/model.22/cv3.0/cv3.0.2/Conv"]
    assert list(short_names(onnx_names).values()) == ["model.0.conv", "model.2.m.0.cv1.conv", "model.22.cv3.0.cv3.0.2"]
    # where the cell path alone repeats, the op is kept (with its index only where needed)
    two = ["Default/b-Cell/Conv2D-op0", "Default/b-Cell/Conv2D-op1", "Default/c-Cell/MatMul-op0"]
    assert list(short_names(two).values()) == ["b.Conv2D-op0", "b.Conv2D-op1", "c.MatMul-op0"]
    assert short_names(["Conv_41", "Conv_44"]) == {"Conv_41": "Conv_41", "Conv_44": "Conv_44"}
    assert fit("features.5.block.2.0", 12) == "featu…ck.2.0" and len(fit("x" * 100, 12)) == 12


def _sensitivity_of(scopes) -> dict:
    ops = [{"node": f"v{i}", "scope": s, "op": "Conv2D", "method": "mse", "alone": {"sqnr_db": 30.0 + i, "cosine": 0.999},
            "output": {"sqnr_db": 20.0 + i, "cosine": 0.99}, "cumulative": {"sqnr_db": 20.0, "cosine": 0.98}}
           for i, s in enumerate(scopes)]
    return {"images": 32, "ranking": [o["node"] for o in ops], "ops": ops}


def test_console_tables_name_layers_short_and_in_full():
    from quantflow.quantization.sensitivity import Sensitivity

    sens = _sensitivity_of(MBV2)
    table = Sensitivity(sens["ops"], 32).table(5).splitlines()
    assert len(table) == 6 and table[0].split()[:2] == ["rank", "layer"] and table[0].endswith("full layer name")
    assert [line.split()[1] for line in table[1:]] == ["features.0.0"] + [f"features.1.block.{k}.0" for k in range(3)] + [
        "features.2.block.0.0"]
    assert all(line.endswith(MBV2[i]) for i, line in enumerate(table[1:]))
    ops = [QuantizedOp(node=f"v{i}", scope=s, op="Conv2D", input="t", scale_d=0.1, offset_d=0, scale_w=np.ones(2),
                       channel_axis=0, weight=np.ones((2, 1, 1, 1), np.int8), bias=np.zeros(2, np.int32),
                       deq_scale=np.ones(2, np.float32)) for i, s in enumerate(MBV2)]
    rows = QuantParams("mse", ops).table().splitlines()
    assert len({r.split()[0] for r in rows[1:]}) == 18 and rows[2].split()[0] == "features.1.block.0.0"
    assert rows[2].endswith(MBV2[1])


def test_the_report_names_layers_short_with_the_full_name_beside_and_as_tooltip():
    sens = _sensitivity_of(MBV2)
    hist = histograms([])
    hist.update({f"v{i}": {"scope": MBV2[i], "hist": np.arange(64), "lo": 0.0, "hi": 6.0, "clip": (0.0, 5.0)}
                 for i in range(4)})
    text = render("m", gate_report(), sens, hist, None)
    rep = Report(text)
    rows = rep.sections["sensitivity"]["rows"][1:]
    assert [r[1] for r in rows] == [short_names(MBV2)[s] for s in MBV2] and len({r[1] for r in rows}) == 18
    assert f'<td title="{MBV2[1]}">features.1.block.0.0</td>' in text
    # four layers with histograms: the heading says four
    assert "Activation ranges of the 4 most sensitive layers" in rep.text("histograms")
    assert len(rep.sections["histograms"]["imgs"]) == 4
    one = Report(render("m", gate_report(), sens, {"v0": hist["v0"]}, None))
    assert "Activation range of the most sensitive layer" in one.text("histograms")


def test_the_chart_legend_covers_no_bar(monkeypatch):
    """The legend sits above the axes: no part of it inside the plot, whatever the bars' lengths."""
    seen = {}
    real = plots._png

    def keep(plt, fig):
        fig.tight_layout()          # as _png lays it out
        fig.canvas.draw()
        ax = fig.axes[0]
        seen["axes"], seen["legend"] = ax.get_window_extent(), ax.get_legend().get_window_extent()
        return real(plt, fig)

    monkeypatch.setattr(plots, "_png", keep)
    plots.sensitivity_chart([f"layer{i}" for i in range(12)], [60.0] * 12, [70.0] * 12)
    assert seen["legend"].y0 >= seen["axes"].y1 - 1      # above the plot area, where no bar is


def test_a_histogram_draws_nothing_where_no_value_fell():
    """Empty bins draw no band along the bottom; a bin of one count still shows."""
    hist = np.zeros(100, np.int64)
    hist[60:80] = 1000
    hist[95] = 1
    img = decode_bytes(plots.activation_histogram("t", hist, 0.0, 10.0, (6.0, 9.9)))
    fill = np.all(np.abs(img.astype(int) - (210, 173, 121)) <= 40, axis=-1)     # the bars' colour (BGR)
    cols = np.where(fill.any(0))[0]
    runs = np.split(cols, np.where(np.diff(cols) > 1)[0] + 1)
    # two runs of filled columns: the bins 60..80 and the one-count bin 95; none where no value fell (the band
    # under every empty bin would join them into one run over the whole axis)
    assert len(runs) == 2
    block, single = runs
    assert len(block) > 4 * len(single) >= 8 and single[0] - block[-1] > len(block) / 2


# ---------------------------------------------------------------------------------------- parts, task, tuning
def _parts_report() -> dict:
    from quantflow.config import OutputPart
    from quantflow.evaluation.outputs import compare_outputs
    from quantflow.evaluation.parts import regions
    from quantflow.evaluation.runs import region_sums

    rng = np.random.default_rng(0)
    f = np.concatenate([rng.uniform(0, 320, (4, 4, 30)), rng.uniform(0, 1, (4, 3, 30))], 1)
    q = f.copy()
    q[:, 4:] = rng.uniform(0, 1, (4, 3, 30))
    regs = regions({"boxes": OutputPart(axis=1, slice="0:4"), "scores": OutputPart(axis=1, slice="4:")},
                   [("output0", (1, 7, 30))], 0.99)
    r = compare_outputs(region_sums({"output0": f}, {"output0": q}, regs, 4), regs, [f"f{i}.png" for i in range(4)],
                        0.99)
    r.update(metric="outputs", quantized_ops=7, calibration_method="minmax")
    return r


def test_each_part_has_its_row_and_the_failing_part_is_named():
    rep = Report(render("m", _parts_report(), sensitivity(), {}, None))
    rows = rep.sections["per-output"]["rows"]
    assert rows[0][:3] == ["output", "part", "slice"]
    assert [r[:2] for r in rows[1:]] == [["output0", ""], ["output0", "boxes"], ["output0", "scores"]]
    limit, verdict = rows[0].index("limit"), rows[0].index("verdict")
    assert rows[1][limit] == "judged by its parts" and rows[2][limit] == "cosine >= 0.99"
    assert rows[3][verdict] == "False"
    assert "Verdict: FAIL" in rep.text("verdict") and "INT8 part scores of output output0 [:, 4:7]" in rep.text("verdict")
    cells = {r[0]: r[1] for r in rep.sections["verdict"]["rows"][1:]}
    assert cells["failing"] == "scores"


def test_a_task_metric_shows_its_numbers_and_limits():
    gate = {"images": 20, "task": "detection", "entry": "x", "passed": False, "failures": ["f1"], "metric": "task",
            "numbers": {"f1": 0.3015, "precision": 0.84, "fp32_detections": 1275.0, "map50_drop": None},
            "limits": [{"number": "f1", "kind": "min", "limit": 0.9, "value": 0.3015, "passed": False}],
            "outputs": _parts_report()["outputs"]}
    rep = Report(render("m", gate, sensitivity(), {}, None))
    cells = {r[0]: r[1] for r in rep.sections["verdict"]["rows"][1:]}
    assert cells["task metric"] == "detection" and cells["f1"] == "0.3015 (needs >= 0.9)"
    assert cells["fp32_detections"] == "1275" and cells["map50_drop"] == "not measured"
    assert "f1 0.3015 does not meet evaluation.min.f1 0.9" in rep.text("verdict")
    assert len(rep.sections["per-output"]["rows"]) == 4


def test_the_report_shows_the_fallback_figure_on_its_tuning_images_beside_the_gate():
    gate = gate_report()
    gate["tuning"] = {"source": "50% of each folder of evaluation.data_dir eval", "images": 9, "passed": True,
                      "figure": "INT8 top-1 0.9000 (drop 0.00 points)"}
    fb = dict(fallback_record(), tuning={"source": gate["tuning"]["source"], "images": 9, "names": ["a.png"]})
    rep = Report(render("m", gate, sensitivity(), {}, fb))
    cells = {r[0]: r[1] for r in rep.sections["verdict"]["rows"][1:]}
    assert cells["held-out images"] == "8 (the gate's: none tuned on)" and cells["INT8 top-1"] == "87.50%"
    assert cells["fallback tuned on"] == "9 images: 50% of each folder of evaluation.data_dir eval"
    assert cells["fallback's figure on them"] == "INT8 top-1 0.9000 (drop 0.00 points) (PASS)"
    assert "Tuned on 9 images (50% of each folder" in rep.text("fallback") and "judged 8 others" in rep.text("fallback")


def test_the_report_says_where_the_tuning_images_could_not_show_the_release_limit():
    from quantflow.evaluation import floor
    from quantflow.report.text import format_table

    said = floor.untellable_line({"unit": "boxes", "images": 64, "float16_changed": 1.0, "limit": 2.0,
                                  "float16_needed": 2, "images_needed": 128})
    gate = gate_report()
    gate["tuning"] = {"source": "64 images of calibration.data_dir calib beyond the calibration sample", "images": 64,
                      "passed": False, "verdict": "PASS", "figure": "f1 1.0000", "untellable": said}
    fb = dict(fallback_record(), tuning={"source": gate["tuning"]["source"], "images": 64, "names": ["a.png"]})
    rep = Report(render("m", gate, sensitivity(), {}, fb))
    cells = {r[0]: r[1] for r in rep.sections["verdict"]["rows"][1:]}
    assert cells["evaluation.max_vs_float16 not shown there"] == said
    assert said.startswith("on 64 images the float16-only path changes 1 boxes, too few to show INT8 within 2x")
    assert f"evaluation.max_vs_float16 could not be shown there: {said}" in format_table(gate)


# ---------------------------------------------------------------------------------------- as a person sees it
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def screenshot(html_file: Path, png: Path, width: int = 1200, height: int = 4000) -> np.ndarray:
    """``html_file`` as headless Chromium shows it (a fresh profile, no network), as a BGR image."""
    assert CHROMIUM, "the report screenshot needs Chromium (Debian: apt-get install -y chromium)"
    profile = png.parent / f"{png.stem}-profile"
    subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                    f"--screenshot={png}", html_file.resolve().as_uri()], capture_output=True, timeout=180, check=True)
    return decode_bytes(png.read_bytes())


def test_the_report_as_a_person_sees_it_in_a_browser(tmp_path):
    """A MobileNetV2-sized report rendered by Chromium: every plot is drawn (the bars' colours on the page), the
    layers' short names are distinct, nothing is cut off at the right.  The screenshot stays in the test's
    folder for a person to look at."""
    sens = _sensitivity_of(MBV2)
    hist = {f"v{i}": {"scope": MBV2[i], "hist": np.histogram(np.random.default_rng(i).gamma(2, size=5000), 256,
                                                              (-1, 12))[0], "lo": -1.0, "hi": 12.0, "clip": (0.0, 8.0)}
            for i in range(6)}
    gate = gate_report()
    gate["tuning"] = {"source": "50% of each folder of evaluation.data_dir eval", "images": 9, "passed": True,
                      "figure": "INT8 top-1 0.9000 (drop 0.00 points)"}
    page = write(tmp_path / "report.html", "quantflow build report: quantflow.demo.mbv2:build", gate, sens, hist,
                 fallback_record())
    shot = screenshot(page, tmp_path / "report.png")
    assert has_colour(shot, (180, 119, 31), tol=10) and has_colour(shot, (14, 127, 255), tol=10)  # both bar colours
    assert has_colour(shot, (210, 173, 121), tol=25)                                   # the histograms' bars
    assert has_colour(shot, RED, tol=40)                                               # clip lines, gate limit
    # nothing drawn in the rightmost strip: the page fits the window
    assert (shot[:, -40:] > 245).all()
    rows = Report(page.read_text()).sections["sensitivity"]["rows"][1:]
    assert len({r[1] for r in rows}) == len(rows) == 18
    print(f"report screenshot: {tmp_path / 'report.png'}")


def test_the_report_says_which_layers_run_in_float16_and_what_precision_was_modelled(tmp_path):
    gate = {**compare(np.eye(3), np.eye(3), np.arange(3), threshold=0.01), "metric": "top1", "quantized_ops": 2,
            "float16_layers": [{"layer": "Default/stem/Conv2D-op0", "op": "Conv2D",
                                "reason": "3 input channels <= 16: CANN's quant pass rolls such convolutions back"}],
            "precision_note": "atc --precision_mode=allow_fp32_to_fp16 may keep float ops in float32"}
    rep = Report(render("t", gate, {"images": 0, "ranking": [], "ops": []}, {}, None))
    device = rep.text("device")
    assert "2 layers run in INT8; 1 quantizable layer(s) in float16" in device
    assert "Default/stem/Conv2D-op0" in device and "rolls such convolutions back" in device
    assert "allow_fp32_to_fp16" in device


def test_a_failing_part_ranks_the_layers_by_that_part_in_the_message_and_the_chart():
    """The whole output ranks op 6 first; the failing part "scores" is hurt most by op 1 (then op 2): the gate's
    advice and the report's table and chart follow the part, as the fallback takes the layers."""
    from types import SimpleNamespace

    from quantflow.quantization.sensitivity import figure
    from quantflow.tasks.fallback import ranked
    from quantflow.tasks.gate import _advice

    s = sensitivity()
    for r in s["ops"]:
        i = int(r["node"][4:])
        r["per_part"] = {"boxes": dict(r["output"]), "scores": {"sqnr_db": 40.0 if i > 2 else 5.0 * i, "cosine": 0.9}}
    gate = _parts_report()
    focused = ranked(s, metric(gate), None, gate)
    by_scores = [r["node"] for r in sorted(s["ops"], key=lambda r: (r["per_part"]["scores"]["sqnr_db"], r["node"]))]
    assert focused["ranking"] == by_scores and by_scores[:3] == ["node0", "node1", "node2"] != s["ranking"][:3]
    assert focused["focus"] == {"outputs": [], "parts": ["scores"]}

    qp = QuantParams("kl", [QuantizedOp(node=f"node{i}", scope=f"Default/block{i}-Cell/Conv2D-op{i}", op="Conv2D",
                                        input=f"t{i}", scale_d=0.1, offset_d=0, scale_w=np.ones(1), channel_axis=0,
                                        weight=np.ones((1, 1, 1, 1), np.int8), bias=np.zeros(1, np.int32),
                                        deq_scale=np.ones(1, np.float32)) for i in range(N_OPS)])
    cfg = SimpleNamespace(quantization=SimpleNamespace(fallback="off", max_fallback=5, recover="auto"),
                          calibration=SimpleNamespace(method="mse"))
    advice = _advice(focused, qp, cfg)
    named = [layer.split(" (")[0] for layer in advice.split("Most sensitive layers for part scores: ")[1].split("; ")]
    assert named[:3] == [f"Default/block{i}-Cell/Conv2D-op{i}" for i in (0, 1, 2)]
    assert "(part scores SQNR 5.0 dB alone in INT8)" in advice

    rep = Report(render("m", gate, focused, {}, None))
    rows = rep.sections["sensitivity"]["rows"]
    assert rows[0][4] == "part scores SQNR dB"
    assert [r[0] for r in rows[1:]] == [str(i) for i in range(1, N_OPS + 1)]
    assert [float(r[4]) for r in rows[1:]] == sorted(figure(r, None, ["scores"]) for r in s["ops"])
    assert "ranked by what fails: the part scores" in rep.text("sensitivity")
