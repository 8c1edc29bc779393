"""`quantflow init`, `list` and `report` without a build; the build itself: tests/test_onnx_pipeline.py."""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from quantflow.cli import main
from quantflow.config import load_config


def _tiny_onnx(path, classes=7):
    w = helper.make_tensor("w", TensorProto.FLOAT, [classes, 3 * 8 * 8], [0.0] * (classes * 192))
    g = helper.make_graph([helper.make_node("Flatten", ["image"], ["f"]), helper.make_node("Gemm", ["f", "w"], ["y"],
                                                                                             transB=1)],
                          "tiny", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", classes])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_init_reads_the_model_and_writes_a_config_that_loads(tmp_path, capsys):
    _tiny_onnx(tmp_path / "net.onnx")
    out = tmp_path / "quantflow.toml"
    assert main(["init", "--onnx", str(tmp_path / "net.onnx"), "-o", str(out)]) == 0
    cfg = load_config(out)
    assert cfg.model.onnx.name == "net.onnx" and cfg.model.input_shape == (1, 3, 8, 8)
    assert cfg.model.input_name == "image" and cfg.model.num_classes == 7
    assert cfg.aipp_template.is_file()  # the shipped template, by name
    text = out.read_text()
    assert "# EDIT: exactly what your training preprocessing did" in text and "[engine]" in text


def test_init_takes_the_class_count_from_the_calibration_folders(tmp_path):
    for c in ("cat", "dog", "eel"):
        (tmp_path / "calib" / c).mkdir(parents=True)
    out = tmp_path / "q.toml"
    assert main(["init", "--entry", "mypkg.net:build", "--checkpoint", "net.ckpt", "--calib", str(tmp_path / "calib"),
                 "-o", str(out)]) == 0
    cfg = load_config(out)
    assert cfg.model.num_classes == 3 and cfg.model.entry == "mypkg.net:build"
    assert cfg.path(cfg.calibration.data_dir) == tmp_path / "calib"


def test_init_never_overwrites(tmp_path, capsys):
    out = tmp_path / "quantflow.toml"
    out.write_text("# mine\n")
    _tiny_onnx(tmp_path / "net.onnx")
    assert main(["init", "--onnx", str(tmp_path / "net.onnx"), "-o", str(out)]) == 2
    assert out.read_text() == "# mine\n"
    assert f"{out} exists" in capsys.readouterr().err


def test_failures_name_the_file_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["build", "missing.toml"]) == 2
    assert "configuration file not found: missing.toml" in capsys.readouterr().err
    assert main(["init", "--onnx", "nowhere.onnx"]) == 2
    assert "--onnx: file not found: nowhere.onnx" in capsys.readouterr().err
    _tiny_onnx(tmp_path / "net.onnx")
    assert main(["init", "--onnx", "net.onnx"]) == 0
    capsys.readouterr()
    assert main(["report"]) == 2
    err = capsys.readouterr().err
    assert "no build to report" in err and str(tmp_path / "build" / "latest.json") in err


def test_list_names_every_stage_before_any_build(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _tiny_onnx(tmp_path / "net.onnx")
    main(["init", "--onnx", "net.onnx"])
    capsys.readouterr()
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for stage in ("preflight", "sample", "graph", "calibrate", "fallback", "export", "aipp", "atc", "gate", "summary"):
        assert f"\n{stage} " in "\n" + out
    assert "nothing built yet" in out
