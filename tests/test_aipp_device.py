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

import numpy as np
import onnx
import pytest
from onnx import helper
from support import aipp_reference as doc
from support import deploy_interpreter
from support.project import run_doit

from quantflow.cli.main import main

STANDIN = Path(__file__).parent / "support" / "ais_bench_standin"
# msaccucmp's golden-file pattern (CANN 8.1 tools/operator_cmp/compare/cmp_utils/reg_manager.py)
NUMPY_DUMP_PATTERN = re.compile(r"^([\.A-Za-z0-9_-]+\.[0-9]+)\.[0-9]{1,255}\.npy$")


def latest(project: Path) -> dict:
    return json.loads((project / "build" / "latest.json").read_text())


def standin_om(folder: Path, build: dict, aipp_cfg: Path | None = None) -> Path:
    """The stand-in's "offline model": the build's deploy.onnx and the AIPP config it was "converted" with."""
    om = folder / "model.om"
    om.write_text(json.dumps({"deploy_onnx": build["deploy_onnx"], "aipp_cfg": str(aipp_cfg or build["aipp_config"])}))
    return om


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.syspath_prepend(str(STANDIN))
    for name in [m for m in sys.modules if m == "ais_bench" or m.startswith("ais_bench.")]:
        monkeypatch.delitem(sys.modules, name)


def verify_report(build: dict) -> dict:
    return json.loads((Path(build["artifacts"]["gate"]) / "device_verify.json").read_text())


def test_verify_without_ais_bench_says_what_to_install(built_demo, tmp_path, monkeypatch, capsys):
    project, _ = built_demo
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


def all_node_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every node output a graph output (the deploy interpreter returns the graph outputs)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    m.graph.output.extend(helper.make_empty_tensor_value_info(o) for n in model.graph.node for o in n.output if o)
    return m


def check_dump(out: Path, build: dict) -> int:
    """Every golden file is named as msaccucmp reads golden data and holds what the deploy interpreter computes for
    that node output, from the dumped frames through the independent AIPP; returns the files checked."""
    listing = json.loads((out / "dump.json").read_text())
    model = onnx.load(build["deploy_onnx"])
    cfg = doc.read_config(Path(build["aipp_config"]).read_text())
    batch = model.graph.input[0].type.tensor_type.shape.dim[0].dim_value
    raw = np.fromfile(out / "input" / "frames.bin", np.uint8).reshape(batch, -1)
    assert raw.shape[1] == doc.frame_bytes(cfg)
    x16 = np.stack([doc.aipp(cfg, f) for f in raw])
    np.testing.assert_array_equal(np.load(out / "input" / "aipp_output.npy"), x16)
    full = all_node_outputs(model)
    values = dict(zip((o.name for o in full.graph.output), deploy_interpreter.run(full, x16)))
    nodes = {n.name: n for n in model.graph.node}
    files = sorted(p.name for p in (out / "golden").iterdir())
    assert files == sorted(Path(g["file"]).name for g in listing["golden"])
    for g in listing["golden"]:
        name = Path(g["file"]).name
        m = NUMPY_DUMP_PATTERN.match(name)
        assert m and m.group(1) == f"{re.sub(r'[^A-Za-z0-9_-]', '_', g['node'])}.{g['output_index']}"
        assert name.endswith(f".{listing['timestamp']}.npy")
        node = nodes[g["node"]]
        want = values[node.output[g["output_index"]]]
        got = np.load(out / g["file"])
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want, err_msg=name)
    dumped = {(g["node"], g["output_index"]) for g in listing["golden"]}
    skipped = {(s["node"], s["output_index"]) for s in listing["not_dumped"]}
    assert dumped | skipped == {(n.name, k) for n in model.graph.node for k, o in enumerate(n.output) if o}
    return len(files)


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
