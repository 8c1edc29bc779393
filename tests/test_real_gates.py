"""benchmarks.real_gates' pure functions: the parts-gated variant of init's [evaluation], the TOML it writes, and
what it reads from a build's accuracy_report.json and recovery.json (no model wheel, no build)."""
import tomllib

import pytest

from benchmarks.real_gates import format_table, gated_by_parts, output_sqnr, sqnr_steps, toml_text, verdicts
from quantflow.config import EvaluationSection

INIT_YOLOV8 = {"metric": "detection", "data_dir": "eval", "min": {"f1": 0.9}, "options": {"layout": "yolov8"},
               "parts": {"boxes": {"output": "output0", "axis": 1, "slice": "0:4", "gate": False},
                         "scores": {"output": "output0", "axis": 1, "slice": "4:", "gate": False}}}


def test_gated_by_parts_gates_every_part_under_the_outputs_metric():
    e = gated_by_parts(INIT_YOLOV8)
    assert e["metric"] == "outputs" and e["min_cosine"] == 0.99 and e["data_dir"] == "eval"
    assert not {"min", "max", "options"} & set(e)
    assert set(e["parts"]) == {"boxes", "scores"}
    for name, part in e["parts"].items():
        assert "gate" not in part   # the default: gated
        assert {k: v for k, v in INIT_YOLOV8["parts"][name].items() if k != "gate"} == part
    assert INIT_YOLOV8["parts"]["boxes"]["gate"] is False   # the input is left as it was


def test_gated_by_parts_refuses_a_head_without_parts():
    with pytest.raises(ValueError, match="no parts"):
        gated_by_parts({"metric": "ctc", "data_dir": "eval"})


def test_toml_text_round_trips_and_loads_as_quantflow_config():
    conf = {"evaluation": INIT_YOLOV8, "quantization": {"fallback": "auto", "recover": "off", "max_fallback": 8}}
    back = tomllib.loads(toml_text(conf, "t"))
    assert back == conf
    ev = EvaluationSection(**back["evaluation"])
    assert ev.metric == "detection" and set(ev.parts) == {"boxes", "scores"}


def test_verdicts_output_sqnr_and_recovery_steps_read_the_artifacts():
    report = {"figures": [{"id": "f1", "label": "f1", "value": 0.8, "kind": "min", "limit": 0.9, "low": 0.0,
                           "high": 1.0, "gated": True, "verdict": "UNDECIDED"},
                          {"id": "x", "label": "x", "value": 1, "kind": "min", "limit": 0, "low": 1, "high": 1,
                           "gated": False, "verdict": "PASS"}],
              "outputs": [{"output": "o", "part": None, "sqnr_db": 30.0}, {"output": "o", "part": "scores",
                                                                           "sqnr_db": 7.5}]}
    assert verdicts(report) == [{"figure": "f1", "value": 0.8, "interval": [0.0, 1.0], "kind": "min",
                                 "limit": 0.9, "verdict": "UNDECIDED"}]
    assert output_sqnr(report) == {"o": 30.0, "o scores": 7.5}
    rec = {"before": {"network output": 10.0, "v1": 3.0},
           "steps": [{"method": "equalize", "kept": True, "after": {"network output": 12.0}},
                     {"method": "ranges", "kept": False, "after": {"network output": 11.0}},
                     {"method": "adaround", "kept": True, "after": {}}]}
    assert sqnr_steps(rec, "network output") == {"before": 10.0, "equalize": 12.0, "ranges (undone)": 11.0}
    guarded = {"before": {"least region": 4.0}, "steps": [{"method": "adaround", "kept": True,
                                                             "after": {"least region": 5.5}}]}
    assert sqnr_steps(guarded) == {"before": 4.0, "adaround": 5.5}   # by default the guard's figure
    assert sqnr_steps({"mode": "off", "steps": []}) == {}


def test_the_table_names_another_draw_of_the_images_by_its_seed():
    report = {"verdict": "PASS", "images": 2, "tuning": {"images": 2},
              "figures": [{"id": "f1", "label": "f1", "value": 0.95, "kind": "min", "limit": 0.9, "low": 0.92,
                           "high": 0.98, "gated": True, "verdict": "PASS"}], "outputs": []}
    row = {"case": "c", "evaluation": INIT_YOLOV8, "calibration_images": 8, "held_out_images": 4, "recover": "off",
           "report": report, "seconds": 3.0}
    first, again = format_table([row, {**row, "seed": 1}]).splitlines()[2:]
    assert "8 / 4: 2 + 2 |" in first and "8 / 4: 2 + 2, seed 1 |" in again
    assert "**PASS**: f1 0.95 [0.92, 0.98] (>= 0.9): PASS" in again
    assert first.split(" | ")[6] == "-"   # a report from before the float16 floor


def test_the_table_puts_int8_beside_the_float16_floor():
    from benchmarks.real_gates import floor_cell

    report = {"distance": {"unit": "strings", "int8_changed": 25.0, "float16_changed": 1.0, "ratio": 25.0,
                           "low": 12.0, "high": 60.0, "int8_mac_share": 0.973}}
    assert floor_cell(report) == "25 / 1 strings: 25x [12, 60]; INT8 97.3% of MACs"


def test_a_retrained_build_is_its_own_project_and_row(tmp_path, monkeypatch):
    from benchmarks import real_gates

    monkeypatch.setattr(real_gates, "write_project", lambda name, m, folder, *a: _plain_project(folder))
    monkeypatch.setattr(real_gates, "init_evaluation", lambda folder: (dict(INIT_YOLOV8), {}))
    case = real_gates.Case("yolov8n_nudenet", 4, 4, parts_gated=True)
    recover, retrain = real_gates.BUILDS["auto + [retrain]"]
    toml, _ = real_gates.project("c", case, tmp_path, recover, 8, 0, retrain)
    conf = tomllib.loads(toml.read_text())
    assert toml.name == "recover-auto-retrain.toml" and conf["build"]["output_dir"] == "build-recover-auto-retrain"
    assert conf["retrain"] == real_gates.RETRAIN and conf["quantization"]["recover"] == "auto"
    plain, _ = real_gates.project("c", case, tmp_path, "auto", 8)
    assert "retrain" not in tomllib.loads(plain.read_text()) and plain != toml
    report = {"verdict": "PASS", "images": 2, "figures": [], "outputs": []}
    row = {"case": "c", "evaluation": INIT_YOLOV8, "calibration_images": 4, "held_out_images": 4,
           "recover": "auto + [retrain]", "report": report, "seconds": 1.0,
           "retrain": {"kept": "started from", "validation_images": 13,
                       "gains": {"retrained": {"gain": 0.0043, "interval": [-0.0057, 0.0205], "kept": False}}}}
    assert "retraining: started from kept (gain 0.0043 [-0.0057, 0.0205] on 13 validation images)" in \
        format_table([row])


def _plain_project(folder):
    folder.mkdir(parents=True, exist_ok=True)
    toml = folder / "quantflow.toml"
    toml.write_text('[model]\nonnx = "model.onnx"\n\n[build]\noutput_dir = "build"\n')
    return toml


def test_a_build_without_retraining_is_read_without_a_retrain_folder(demo_project, monkeypatch):
    """run_build reads the artifacts of the stages the configuration has (no build is run here: none is found)."""
    import subprocess

    from benchmarks import real_gates

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0))
    out = real_gates.run_build(demo_project / "quantflow.toml")
    assert out["exit"] == 0 and out["retrain"] is None and out["report"] is None and "error" in out
