"""The ``quantflow`` command.  ``init``, ``list``, ``report`` and the error paths run in this process; the builds
run the command as a subprocess in a fresh folder holding only quantflow.toml, a small ONNX network (fixed random
weights, nothing to train) and 6 images per class from the shipped demo folders.  Each build takes seconds."""
from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.project import clean_env, run_quantflow, task_lines, tiny_onnx, tiny_project

from quantflow.cli import main
from quantflow.config import load_config
from quantflow.pipeline.doit_graph import DEFAULT_TASKS

UNUSED = {"train", "retrain", "sensitivity"}   # no [train] or [retrain]; fallback off: no per-layer analysis for a passing gate


def _variant(project: Path, name: str, **replace: str) -> str:
    """``project``/<name>, a copy of its quantflow.toml with text replaced (``output_dir='"build_a"'``)."""
    text = (project / "quantflow.toml").read_text()
    for key, value in replace.items():
        line = next(x for x in text.splitlines() if x.startswith(f"{key} = "))
        text = text.replace(line, f"{key} = {value}")
    (project / name).write_text(text)
    return name


def _latest(project: Path, out: str = "build") -> dict:
    return json.loads((project / out / "latest.json").read_text())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The project after `quantflow build`: (folder, completed process)."""
    project = tiny_project(tmp_path_factory.mktemp("tiny_project"))
    assert sorted(p.name for p in project.iterdir()) == ["calib_data", "eval_data", "quantflow.toml", "tiny.onnx"]
    proc = run_quantflow(project, "build")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return project, proc


# ----------------------------------------------------------------------------- build, report, list

def test_a_folder_with_only_config_model_and_images_builds(tiny):
    project, proc = tiny
    assert task_lines(proc.stdout) == {t: "ran" for t in DEFAULT_TASKS if t not in UNUSED}
    latest = _latest(project)
    assert latest["gate"]["passed"] is True
    assert all(Path(d).is_relative_to(project / "build") for d in latest["artifacts"].values())
    assert (project / "build" / ".doit.sqlite").is_file() and (project / "build" / ".quantflow.lock").is_file()
    assert not (project / "dodo.py").exists() and not (project / ".doit.db").exists()
    again = run_quantflow(project, "build")
    assert again.returncode == 0, again.stderr
    assert task_lines(again.stdout) == {t: "up-to-date" for t in DEFAULT_TASKS if t not in UNUSED}


def test_report_prints_the_accuracy_report_and_the_gate_verdict(tiny):
    project, _ = tiny
    latest = _latest(project)
    proc = run_quantflow(project, "report")
    assert proc.returncode == 0, proc.stderr
    assert Path(latest["accuracy_report"]).read_text() in proc.stdout
    assert "gate: PASS (FP32 top-1" in proc.stdout and f"build report: {latest['report']}" in proc.stdout


def test_list_gives_each_stage_its_state_and_folder_and_build_runs_a_named_stage(tiny):
    project, _ = tiny
    latest = _latest(project)

    def rows(config: str) -> dict[str, str]:
        proc = run_quantflow(project, "list", config)
        assert proc.returncode == 0, proc.stderr
        return {line.split()[0]: line for line in proc.stdout.splitlines()}

    listed = rows("quantflow.toml")
    assert list(listed) == DEFAULT_TASKS
    for stage, folder in latest["artifacts"].items():
        assert "up to date" in listed[stage] and f"[{folder}]" in listed[stage], listed[stage]
    assert "not used" in listed["train"] and "up to date" in listed["summary"]
    # another threshold, the same output_dir: the gate to run, and the recovery (its check on the calibration images
    # beyond the sample is judged by the gate's limits) with the stages that read its parameters; the graph, the
    # calibration and the AIPP config found as built
    judged = {"recover", "fallback", "export", "atc", "gate"}
    config = _variant(project, "stricter.toml", threshold="0.9")
    listed = rows(config)
    assert all("to run" in listed[s] and latest["artifacts"][s] not in listed[s] for s in judged), listed
    assert all("up to date" in listed[s] for s in latest["artifacts"] if s not in judged)
    proc = run_quantflow(project, "build", config, "gate")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    status = task_lines(proc.stdout)
    assert status["gate"] == "ran" and status["calibrate"] == "up-to-date" and "summary" not in status
    listed = rows(config)
    assert "up to date" in listed["gate"] and "to run" in listed["summary"]


# ----------------------------------------------------------------------------- several configs, failures, doit

def test_two_configs_build_in_parallel_each_in_its_own_output_dir(tiny):
    project, _ = tiny
    a = _variant(project, "a.toml", output_dir='"build_a"')
    b = _variant(project, "b.toml", output_dir='"build_b"', threshold="0.5")
    proc = run_quantflow(project, "build", a, b, "-j", "2")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "===== a.toml: built" in proc.stdout and "===== b.toml: built" in proc.stdout
    la, lb = _latest(project, "build_a"), _latest(project, "build_b")
    assert la["gate"]["threshold"] == 1.0 and lb["gate"]["threshold"] == 0.5
    for out, latest in (("build_a", la), ("build_b", lb)):
        assert all(Path(d).is_relative_to(project / out) for d in latest["artifacts"].values())
        assert (project / out / ".doit.sqlite").is_file()
    # the same calibration in both: identical INT8 parameters, written twice, apart
    assert Path(la["qparams"]).read_bytes() == Path(lb["qparams"]).read_bytes() and la["qparams"] != lb["qparams"]


def test_two_configs_with_one_output_dir_are_refused_naming_it(tiny):
    project, _ = tiny
    proc = run_quantflow(project, "build", "quantflow.toml", _variant(project, "c.toml"), "-j", "2")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (f"quantflow: quantflow.toml and c.toml both build into {project / 'build'}: give them different "
            f"build.output_dir") in proc.stderr
    assert "=====" not in proc.stdout  # refused before anything ran


def test_a_failing_stage_exits_1_with_doits_report_of_it(tiny):
    project, _ = tiny
    config = _variant(project, "short.toml", count="70", per_class_min="7", output_dir='"build_short"')
    proc = run_quantflow(project, "build", config)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    assert "TaskFailed - taskid:sample" in proc.stdout + proc.stderr
    assert "calibration.per_class_min=7 but some classes have fewer usable images" in proc.stdout + proc.stderr


def test_a_stage_refusing_a_setting_exits_2_with_one_line_naming_file_and_field(tiny):
    project, _ = tiny
    config = _variant(project, "wrong.toml", num_classes="11", count="66", output_dir='"build_wrong"')
    proc = run_quantflow(project, "build", config)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out and "TaskFailed" not in out
    assert [line for line in out.splitlines() if line.startswith("quantflow: ")] == [
        "quantflow: wrong.toml: model.num_classes = 11, but the network's output has shape [1, 10] (10 classes)"]


def test_a_three_line_dodo_py_runs_the_same_graph_with_doits_parallel_tasks(tiny):
    """`doit -n 2` (stages in 2 processes: aipp beside graph and calibrate) builds what quantflow build built."""
    import subprocess
    import sys

    project, _ = tiny
    (project / "dodo.py").write_text("from quantflow.pipeline.doit_graph import *  # noqa: F401,F403\n"
                                     "from quantflow.pipeline.doit_graph import doit_config\n"
                                     "DOIT_CONFIG = doit_config()\n")
    config = _variant(project, "n.toml", output_dir='"build_n"')
    try:
        proc = subprocess.run([sys.executable, "-m", "doit", "-n", "2", f"config={config}"], cwd=project,
                              env=clean_env(), capture_output=True, text=True, timeout=600)
    finally:
        (project / "dodo.py").unlink()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert task_lines(proc.stdout) == {t: "ran" for t in DEFAULT_TASKS if t not in UNUSED}
    first, parallel = _latest(project), _latest(project, "build_n")
    assert parallel["gate"] == first["gate"]
    for artifact in ("qparams", "deploy_onnx", "record", "aipp_config"):
        assert Path(parallel[artifact]).read_bytes() == Path(first[artifact]).read_bytes(), artifact


# ----------------------------------------------------------------------------- init and errors, in this process

def test_init_reads_the_model_and_writes_a_config_that_loads(tmp_path):
    tiny_onnx(tmp_path / "net.onnx", classes=7, size=8)
    out = tmp_path / "quantflow.toml"
    assert main(["init", "--onnx", str(tmp_path / "net.onnx"), "-o", str(out)]) == 0
    cfg = load_config(out)
    assert cfg.model.onnx.name == "net.onnx" and cfg.model.input_shape == (1, 3, 8, 8)
    assert cfg.model.input_name == "image" and cfg.model.num_classes == 7
    assert cfg.aipp_template.is_file()  # the shipped template, by name
    text = out.read_text()
    assert "# EDIT: exactly what your training preprocessing did" in text
    for section in ("model", "normalization", "calibration", "evaluation", "quantization", "aipp", "build", "engine"):
        assert f"\n[{section}]\n" in text


def test_init_takes_the_class_count_from_the_data_folders(tmp_path):
    for c in ("cat", "dog", "eel"):
        (tmp_path / "calib" / c).mkdir(parents=True)
    out = tmp_path / "q.toml"
    assert main(["init", "--entry", "mypkg.net:build", "--checkpoint", "net.ckpt",
                 "--data", str(tmp_path / "calib"), "-o", str(out)]) == 0
    cfg = load_config(out)
    assert cfg.model.num_classes == 3 and cfg.model.entry == "mypkg.net:build"
    assert cfg.path(cfg.calibration.data_dir) == tmp_path / "calib"


def test_init_gives_a_detector_the_outputs_gate(tmp_path):
    """Two 4-D heads (as a detector exports them): no class count, the outputs gate on unlabelled folders."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(0, 0.3, (6, 3, 4, 4)).astype(np.float32), "w1"),
               numpy_helper.from_array(rng.normal(0, 0.3, (6, 3, 2, 2)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["image", "w1"], ["c1"], strides=[4, 4]), helper.make_node("Sigmoid", ["c1"], ["coarse"]),
             helper.make_node("Conv", ["image", "w2"], ["c2"], strides=[2, 2]), helper.make_node("Sigmoid", ["c2"], ["fine"])]
    g = helper.make_graph(nodes, "heads", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("coarse", TensorProto.FLOAT, [1, 6, 4, 4]),
                           helper.make_tensor_value_info("fine", TensorProto.FLOAT, [1, 6, 8, 8])], weights)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(tmp_path / "det.onnx"))
    out = tmp_path / "quantflow.toml"
    assert main(["init", "--onnx", str(tmp_path / "det.onnx"), "-o", str(out)]) == 0
    cfg = load_config(out)
    assert cfg.evaluation.metric == "outputs" and cfg.model.num_classes is None and cfg.labelled_classes is None
    assert cfg.evaluation.min_cosine == 0.99 and cfg.evaluation.threshold is None
    assert "[[1, 6, 4, 4], [1, 6, 8, 8]] are gated by evaluation.metric" in out.read_text()
    assert cfg.calibration.count == 150   # half of the 300 images of the default folder (the rest tune)


def test_init_samples_no_more_calibration_images_than_the_folder_holds(tmp_path):
    """12 images in two class folders (and a file that is no image): not the default 200, which the build's sampling
    would refuse, and not all 12 either: half of them are left to tune on (images the ranges were not fitted on)."""
    tiny_onnx(tmp_path / "net.onnx", classes=2, size=8)
    for i in range(12):
        (tmp_path / "calib" / str(i % 2)).mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(tmp_path / "calib" / str(i % 2) / f"f{i}.png"), np.zeros((8, 8, 3), np.uint8))
    (tmp_path / "calib" / "0" / "notes.txt").write_text("not an image")
    out = tmp_path / "quantflow.toml"
    assert main(["init", "--onnx", str(tmp_path / "net.onnx"), "--calib", str(tmp_path / "calib"), "-o", str(out)]) == 0
    cfg = load_config(out)
    assert cfg.calibration.count == 6 and "; 6 of the 12 found there: the other 6 tune" in out.read_text()


def test_init_leaves_tuning_images_out_of_the_sample_only_where_the_folder_is_small():
    from quantflow.scaffold import CALIBRATION_COUNT, calibration_count

    assert calibration_count(664, None) == (CALIBRATION_COUNT, "")          # 464 left beyond the sample
    count, note = calibration_count(300, None)
    assert count == 150 and "the other 150 tune" in note
    assert calibration_count(None, None)[0] == CALIBRATION_COUNT           # no folder yet
    assert calibration_count(3000, 1000) == (1000, "")                      # one per class at least


def test_init_never_overwrites(tmp_path, capsys):
    out = tmp_path / "quantflow.toml"
    out.write_text("# mine\n")
    tiny_onnx(tmp_path / "net.onnx")
    assert main(["init", "--onnx", str(tmp_path / "net.onnx"), "-o", str(out)]) == 2
    assert out.read_text() == "# mine\n"
    assert f"{out} exists" in capsys.readouterr().err


def test_failures_name_the_file_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def fails(*argv: str) -> str:
        assert main(list(argv)) == 2
        return capsys.readouterr().err

    assert "quantflow: configuration file not found: missing.toml" in fails("build", "missing.toml")
    assert "quantflow: configuration file not found: quantflow.toml" in fails("build")
    assert "'gatee' is neither a configuration file nor a stage" in fails("build", "gatee")
    assert "--onnx: file not found: nowhere.onnx" in fails("init", "--onnx", "nowhere.onnx")
    tiny_onnx(tmp_path / "net.onnx")
    assert main(["init", "--onnx", "net.onnx"]) == 0
    capsys.readouterr()
    err = fails("report")
    assert "no build to report" in err and str(tmp_path / "build" / "latest.json") in err
    Path("bad.toml").write_text(Path("quantflow.toml").read_text().replace("count = 200", "count = 200\ncont = 3"))
    assert "invalid configuration in bad.toml:\n  calibration.cont: unknown key" in fails("list", "bad.toml")
    assert "invalid configuration in bad.toml" in fails("build", "bad.toml")
    assert "-j must be at least 1" in fails("build", "-j", "0", "quantflow.toml", "bad.toml")


def test_list_names_every_stage_before_any_build(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny_onnx(tmp_path / "net.onnx")
    main(["init", "--onnx", "net.onnx"])
    capsys.readouterr()
    assert main(["list"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert rows[:-1] == DEFAULT_TASKS and rows[-1] == "(nothing"
