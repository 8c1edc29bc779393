"""`quantflow verify` and `quantflow dump`, and the demo built for YUV420SP_U8 frames.

No Ascend host here: ais_bench's InferSession is a stand-in (tests/support/ais_bench_standin) whose "device" is
AIPP written from CANN's documentation (support.aipp_reference) feeding deploy.onnx through the deploy interpreter
(support.deploy_interpreter); neither imports quantflow.  These are the only tests of the two commands, and what
they show is that the commands feed, read and compare correctly: not that a real .om agrees."""
import json
import re
import shutil
import sys
from pathlib import Path

import onnx
import pytest
from support.device_standin import check_dump, forget_ais_bench, standin_om, use_standin
from support.project import run_doit

from quantflow.cli.main import main

def latest(project: Path) -> dict:
    return json.loads((project / "build" / "latest.json").read_text())


@pytest.fixture
def standin(monkeypatch):
    use_standin(monkeypatch)


def verify_report(build: dict) -> dict:
    return json.loads((Path(build["artifacts"]["gate"]) / "device_verify.json").read_text())


def test_verify_without_ais_bench_says_what_to_install(built_demo, tmp_path, monkeypatch, capsys):
    project, _ = built_demo
    forget_ais_bench(monkeypatch)
    monkeypatch.setitem(sys.modules, "ais_bench", None)  # not importable, whatever is installed
    om = standin_om(tmp_path, latest(project))
    assert main(["verify", str(project / "quantflow.toml"), "--om", str(om)]) == 2
    err = capsys.readouterr().err
    for words in ("ais_bench", "aclruntime", "not on PyPI", "gitee.com/ascend", "set_env.sh"):
        assert words in err
    assert "Traceback" not in err


def test_verify_compares_every_output_with_the_emulation(built_demo, tmp_path, standin):
    project, _ = built_demo
    build = latest(project)
    om = standin_om(tmp_path, build)
    assert main(["verify", str(project / "quantflow.toml"), "--om", str(om), "--images", "24"]) == 0
    report = verify_report(build)
    assert report["images"] == 24 and report["om"] == str(om) and report["input_format"] == "RGB888_U8"
    (out,) = report["outputs"]
    # the stand-in's independent AIPP and deploy interpreter compute what the emulation computed, bit for bit
    assert out["cosine"] == 1.0 and out["max_abs_diff"] == 0.0 and out["identical_share"] == 1.0
    assert report["passed"] is True and out["worst"]["image"].startswith("eval_data/")


def test_verify_reports_a_device_that_computes_otherwise(built_demo, tmp_path, standin):
    """A "device" whose AIPP subtracts another green mean: verify fails, naming the worst image."""
    project, _ = built_demo
    build = latest(project)
    text = Path(build["aipp_config"]).read_text()
    other = tmp_path / "other.cfg"
    other.write_text(re.sub(r"mean_chn_1 : (\d+)", lambda m: f"mean_chn_1 : {int(m.group(1)) + 40}", text))
    om = standin_om(tmp_path, build, other)
    assert main(["verify", str(project / "quantflow.toml"), "--om", str(om), "--images", "24",
                 "--min-cosine", "0.99999"]) == 1
    report = verify_report(build)
    (out,) = report["outputs"]
    assert report["passed"] is False and out["cosine"] < 0.99999
    assert out["identical_share"] < 1.0 and out["max_abs_diff"] > 0
    assert out["worst"]["cosine"] <= out["cosine"] and out["worst"]["image"].startswith("eval_data/")


def test_verify_refuses_an_om_that_takes_other_frames(built_demo, tmp_path, standin, capsys):
    project, _ = built_demo
    build = latest(project)
    other = tmp_path / "other.cfg"
    other.write_text(Path(build["aipp_config"]).read_text().replace("src_image_size_w : 32", "src_image_size_w : 34"))
    om = standin_om(tmp_path, build, other)
    assert main(["verify", str(project / "quantflow.toml"), "--om", str(om), "--images", "2"]) == 2
    assert "the .om's input takes 3264 bytes per batch of 1, the frames of this build's AIPP config (RGB888_U8) " \
           "are 3072" in capsys.readouterr().err


def test_dump_writes_goldens_named_for_cann_accuracy_comparison(built_demo, tmp_path):
    project, _ = built_demo
    build = latest(project)
    out = tmp_path / "dump"
    assert main(["dump", str(project / "quantflow.toml"), "-o", str(out)]) == 0
    model = onnx.load(build["deploy_onnx"])
    assert check_dump(out, build) == sum(1 for n in model.graph.node for o in n.output if o)
    types: dict[str, set] = {}
    for g in json.loads((out / "dump.json").read_text())["golden"]:
        types.setdefault(g["op_type"], set()).add(g["dtype"])
    # DigitsNet's stem reads 3 channels (float16 on the device); its other convolutions and its Dense layers (Gemm)
    # are INT8: their cubes accumulate in int32
    assert types["AscendQuant"] == {"int8"} and types["Gemm"] == {"int32"} and types["AscendDequant"] == {"float32"}
    assert types["Conv"] == {"float32", "int32"}
    # a second dump replaces the first (one timestamp in the folder); a folder of other files is refused
    first = json.loads((out / "dump.json").read_text())["timestamp"]
    image = project / "eval_data" / "3" / sorted(p.name for p in (project / "eval_data" / "3").iterdir())[0]
    assert main(["dump", str(project / "quantflow.toml"), "-o", str(out), "--image", str(image)]) == 0
    listing = json.loads((out / "dump.json").read_text())
    assert listing["timestamp"] != first and listing["images"] == [str(image)]
    assert check_dump(out, build) == len(listing["golden"])
    other = tmp_path / "other"
    other.mkdir()
    (other / "mine.txt").write_text("x")
    assert main(["dump", str(project / "quantflow.toml"), "-o", str(other)]) == 2


@pytest.mark.slow
def test_demo_builds_and_passes_its_gate_with_yuv420sp_frames(built_demo, tmp_path, standin):
    """The demo with NV12 camera frames (BT.601 narrow): the AIPP check, the gate on what the device computes from
    those frames, then verify and dump on that build."""
    project = tmp_path / "yuv"
    shutil.copytree(built_demo[0], project, symlinks=True)  # the trained checkpoint and unchanged stages come along
    toml = project / "quantflow.toml"
    text = toml.read_text()
    aipp_section = re.search(r"\[aipp\]\n(?:[^\[\n][^\n]*\n)*", text).group(0)
    toml.write_text(text.replace(aipp_section, '[aipp]\ninput_format = "YUV420SP_U8"\ncolor_matrix = "bt601_narrow"\n\n'))
    proc = run_doit(project)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    build = latest(project)
    assert build["gate"]["passed"] is True
    gate = json.loads((Path(build["artifacts"]["gate"]) / "accuracy_report.json").read_text())
    assert gate["passed"] is True and gate["drop"] <= gate["threshold"] and gate["images"] == 359
    check = json.loads((Path(build["artifacts"]["aipp"]) / "aipp_check.json").read_text())
    assert check["input_format"] == "YUV420SP_U8" and check["csc"]["standard"] == "bt601_narrow"
    assert check["params"]["csc_switch"] == "true" and check["params"]["matrix_r0c2"] == "409"  # RGB rows
    assert check["max_abs_diff"] <= max(check["csc"]["bound"]) + check["tolerance"] * 5
    om = standin_om(tmp_path, build)
    assert main(["verify", str(toml), "--om", str(om), "--images", "60"]) == 0
    (out,) = verify_report(build)["outputs"]
    assert out["cosine"] == 1.0 and out["identical_share"] == 1.0
    dump = tmp_path / "dump"
    assert main(["dump", str(toml), "-o", str(dump)]) == 0
    assert check_dump(dump, build) > 0
    assert json.loads((dump / "dump.json").read_text())["frames_bytes"] == 32 * 32 * 3 // 2
