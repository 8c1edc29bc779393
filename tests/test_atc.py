"""atc: lookup, exact command line, and error handling, through a stand-in `atc` executable.

No CANN toolkit can be installed here, so the tests put a small program named `atc` on PATH
(or under $ASCEND_TOOLKIT_HOME) that records its arguments and behaves like atc: it writes
<output>.om on success and prints an E-coded error and exits non-zero on failure.
"""
import json
import os
import sys
import tomllib
from pathlib import Path

import pytest

from quantflow.backends.atc import atc_command, find_atc, not_found_reason, run_atc
from quantflow.errors import AtcError

REPO = Path(__file__).resolve().parents[1]

FAKE_ATC = f"""#!{sys.executable}
import json, os, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_ATC_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
opts = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
mode = os.environ.get("FAKE_ATC_MODE", "ok")
if mode == "sleep":
    time.sleep(30)
if opts.get("soc_version") != "Ascend310P3" or mode == "fail":
    print("ATC start working now, please wait for a moment.")
    print("E10001: Value [%s] for parameter [--soc_version] is invalid. Reason: not supported." % opts.get("soc_version"))
    print("ATC run failed, Please check the detail log, Try 'atc --help' for more information", file=sys.stderr)
    sys.exit(1)
model, framework = opts.get("model", ""), opts.get("framework")
if not os.path.isfile(model) or {{"1": ".air", "5": ".onnx"}}.get(framework) != os.path.splitext(model)[1]:
    print("E10001: Value [%s] for parameter [--model] is invalid with --framework=%s." % (model, framework))
    sys.exit(1)
if mode != "no_output":
    open(opts["output"] + ".om", "wb").write(b"OM-bytes")
print("ATC run success, welcome to the next use.")
"""


def fake_atc_on_path(folder: Path, monkeypatch) -> tuple[Path, Path]:
    """``FAKE_ATC`` as ``folder/bin/atc``, first on PATH for the rest of the test (no CANN toolkit home):
    (the executable, the log of its calls, ``folder/atc_calls.jsonl``)."""
    bindir = folder / "bin"
    bindir.mkdir()
    exe = bindir / "atc"
    exe.write_text(FAKE_ATC)
    exe.chmod(0o755)
    log = folder / "atc_calls.jsonl"
    monkeypatch.setenv("FAKE_ATC_LOG", str(log))
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return exe, log


@pytest.fixture
def fake_atc(tmp_path, monkeypatch):
    (tmp_path / "m.air").write_bytes(b"AIR model")  # the model the direct command-line tests convert
    return fake_atc_on_path(tmp_path, monkeypatch)


def test_find_atc_on_path_and_in_toolkit_home(tmp_path):
    assert find_atc({"PATH": str(tmp_path)}) is None
    home = tmp_path / "Ascend" / "ascend-toolkit" / "latest"
    (home / "compiler" / "bin").mkdir(parents=True)
    atc = home / "compiler" / "bin" / "atc"
    atc.write_text("#!/bin/sh\n")
    atc.chmod(0o755)
    assert find_atc({"PATH": str(tmp_path), "ASCEND_TOOLKIT_HOME": str(home)}) == atc
    assert "not on PATH and $ASCEND_TOOLKIT_HOME is not set" in not_found_reason({"PATH": ""})
    assert str(tmp_path) in not_found_reason({"PATH": "", "ASCEND_TOOLKIT_HOME": str(tmp_path)})


def test_command_line_is_exact(tmp_path):
    cmd = atc_command(Path("/opt/atc"), tmp_path / "model.air", 1, tmp_path / "model", "Ascend310P3",
                      tmp_path / "aipp.cfg", "allow_fp32_to_fp16", "x", (1, 3, 32, 32))
    assert cmd == ["/opt/atc", f"--model={tmp_path}/model.air", "--framework=1", f"--output={tmp_path}/model",
                   "--soc_version=Ascend310P3", f"--insert_op_conf={tmp_path}/aipp.cfg",
                   "--precision_mode=allow_fp32_to_fp16", "--input_shape=x:1,3,32,32"]
    onnx_cmd = atc_command(Path("/opt/atc"), tmp_path / "deploy.onnx", 5, tmp_path / "model", "Ascend310P3",
                           None, "force_fp16", "input", (4, 1, 28, 28))
    assert onnx_cmd == ["/opt/atc", f"--model={tmp_path}/deploy.onnx", "--framework=5", f"--output={tmp_path}/model",
                        "--soc_version=Ascend310P3", "--precision_mode=force_fp16", "--input_shape=input:4,1,28,28"]


def test_successful_run_writes_the_om(fake_atc, tmp_path):
    exe, log = fake_atc
    out = tmp_path / "out" / "model"
    cmd = atc_command(find_atc(), tmp_path / "m.air", 1, out, "Ascend310P3", None, "force_fp16", "x", (1, 3, 32, 32))
    result = run_atc(cmd, out, timeout_s=60)
    assert result["om"] == "model.om" and (out.parent / "model.om").read_bytes() == b"OM-bytes"
    assert "ATC run success" in result["log"]
    assert json.loads(log.read_text().splitlines()[0]) == cmd[1:]


def test_failure_surfaces_atc_own_error_text(fake_atc, tmp_path):
    out = tmp_path / "model"
    cmd = atc_command(find_atc(), tmp_path / "m.air", 1, out, "Ascend999", None, "force_fp16", "x", (1, 3, 32, 32))
    with pytest.raises(AtcError) as e:
        run_atc(cmd, out, timeout_s=60)
    msg = str(e.value)
    assert "exit code 1" in msg
    assert "E10001: Value [Ascend999] for parameter [--soc_version] is invalid" in msg
    assert "ATC run failed" in msg
    assert not list(tmp_path.glob("*.om"))


def test_exit_zero_without_om_and_timeout(fake_atc, tmp_path, monkeypatch):
    out = tmp_path / "model"
    cmd = atc_command(find_atc(), tmp_path / "m.air", 1, out, "Ascend310P3", None, "force_fp16", "x", (1, 3, 8, 8))
    monkeypatch.setenv("FAKE_ATC_MODE", "no_output")
    with pytest.raises(AtcError, match="exited 0 but wrote no"):
        run_atc(cmd, out, timeout_s=60)
    monkeypatch.setenv("FAKE_ATC_MODE", "sleep")
    with pytest.raises(AtcError, match="did not finish within 1 s"):
        run_atc(cmd, out, timeout_s=1)


# ----------------------------------------------------------------------------- the pipeline's atc stage

def write_export(kdir, air: bool, reason: str = "no Ascend backend"):
    """An export.json as the export stage writes it (with FP32 and deploy AIRs when ``air``)."""
    for name in ("deploy.onnx", "graph.onnx") + (("model.air", "deploy.air") if air else ()):
        (kdir / name).write_bytes(b"model " + name.encode())
    (kdir / "export.json").write_text(json.dumps({
        "mindir": "model.mindir", "air": "model.air" if air else None, "air_skipped": None if air else reason,
        "deploy_air": "deploy.air" if air else None, "fp32_onnx": "graph.onnx", "deploy_onnx": "deploy.onnx"}))


def set_build(b, **build):
    b.cfg = b.cfg.model_copy(update={"build": b.cfg.build.model_copy(update=build)})


@pytest.fixture
def atc_stage(tmp_path, monkeypatch):
    """The atc stage as its doit task runs it, on a prepared artifact folder that is every stage's folder
    (export.json and aipp.cfg sit beside atc.json): (the build, the task's action, the folder)."""
    from quantflow.config import config_from_dict
    from quantflow.pipeline import doit_graph
    from quantflow.pipeline.build import Build
    from quantflow.tasks import STAGES

    class OneFolder(Build):
        def dir(self, name, create=True):
            return kdir

    d = tomllib.loads((REPO / "quantflow.toml").read_text())
    kdir = tmp_path / "build" / "artifacts" / "k"
    kdir.mkdir(parents=True)
    (kdir / "aipp.cfg").write_text("aipp_op {\n}\n")
    b = OneFolder(config_from_dict(d, root=tmp_path))
    monkeypatch.setitem(doit_graph._bound, "build", b)
    return b, doit_graph._action(STAGES["atc"]), kdir


@pytest.mark.parametrize("atc_model,air,model,framework", [
    ("int8", False, "deploy.onnx", 5), ("int8", True, "deploy.air", 1),
    ("fp32", False, "graph.onnx", 5), ("fp32", True, "model.air", 1)])
def test_stage_converts_the_configured_model(fake_atc, atc_stage, monkeypatch, atc_model, air, model, framework):
    b, run, kdir = atc_stage
    exe, log = fake_atc
    set_build(b, atc_model=atc_model)
    write_export(kdir, air=air)
    assert run() is None
    status = json.loads((kdir / "atc.json").read_text())
    assert status["status"] == "built" and status["om"] == "model.om" and (kdir / "model.om").is_file()
    assert status["input"] == model and status["framework"] == framework
    args = json.loads(log.read_text().splitlines()[0])
    scratch = Path(args[2].split("=", 1)[1]).parent  # atc writes into a scratch folder, the .om is moved out
    assert scratch.parent == kdir and scratch.name == ".atc.partial-d" and not scratch.exists()
    assert args == [f"--model={kdir / model}", f"--framework={framework}", f"--output={scratch / 'model'}",
                    "--soc_version=Ascend310P3", f"--insert_op_conf={kdir / 'aipp.cfg'}",
                    "--precision_mode=force_fp16", "--input_shape=x:1,3,32,32"]
    from quantflow.tasks import STAGES
    assert STAGES["atc"].uptodate(b) and (kdir / ".atc.done").is_file()


def test_stage_skips_plainly_and_writes_no_om(atc_stage, monkeypatch, capsys):
    b, run, kdir = atc_stage
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    write_export(kdir, air=True)
    assert run() is None
    out = capsys.readouterr().out
    assert "SKIPPED atc conversion for Ascend310P3: atc (CANN toolkit) not found" in out
    assert "no .om was written" in out
    assert json.loads((kdir / "atc.json").read_text())["status"] == "skipped"
    assert not list(kdir.glob("*.om"))


def test_stage_skip_fails_when_an_om_is_required(atc_stage, monkeypatch):
    b, run, kdir = atc_stage
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    set_build(b, require_om=True)
    write_export(kdir, air=False)
    failed = run()
    assert failed is not None and "require_om" in str(failed) and "atc (CANN toolkit) not found" in str(failed)


def test_stage_failure_reports_atc_text(fake_atc, atc_stage, monkeypatch):
    b, run, kdir = atc_stage
    monkeypatch.setenv("FAKE_ATC_MODE", "fail")
    write_export(kdir, air=True)
    failed = run()
    assert failed is not None and "E10001" in str(failed)
    assert not (kdir / ".atc.done").exists()


def test_extra_atc_args_are_passed_after_quantflow_own(fake_atc, atc_stage, monkeypatch):
    b, run, kdir = atc_stage
    exe, log = fake_atc
    set_build(b, atc_args=("--fusion_switch_file=fusion.cfg", "--buffer_optimize=off_optimize"))
    write_export(kdir, air=False)
    assert run() is None
    args = json.loads(log.read_text().splitlines()[0])
    assert args[-2:] == ["--fusion_switch_file=fusion.cfg", "--buffer_optimize=off_optimize"]
    assert json.loads((kdir / "atc.json").read_text())["command"][-2:] == args[-2:]


@pytest.mark.parametrize("args,message", [
    (["--fusion_swich_file=f.cfg"], "unknown atc option --fusion_swich_file (did you mean --fusion_switch_file?)"),
    (["--soc_version=Ascend910"], "--soc_version is set by quantflow from build.soc_version"),
    (["--output=x"], "--output is set by quantflow"),
    (["buffer_optimize"], "'buffer_optimize' is not an atc option"),
    (["--dynamic_batch_size=1,2,4"], "atc does not accept dynamic shapes for a quantized (int8) deploy model"),
])
def test_bad_atc_args_are_refused_naming_the_field(args, message):
    from quantflow.config import config_from_dict
    from quantflow.errors import ConfigError

    d = tomllib.loads((REPO / "quantflow.toml").read_text())
    d["build"]["atc_args"] = args
    with pytest.raises(ConfigError) as e:
        config_from_dict(d, REPO)
    assert "build" in str(e.value) and message in str(e.value)
    d["build"].update(atc_model="fp32", atc_args=["--dynamic_batch_size=1,2,4"])  # fine for the FP32 network
    assert config_from_dict(d, REPO).build.atc_args == ("--dynamic_batch_size=1,2,4",)


@pytest.mark.parametrize("build,message", [
    ({"precision_mode": "force_fp32"}, "precision_mode 'force_fp32' keeps float32"),
    ({"precision_mode": "must_keep_origin_dtype"}, "precision_mode 'must_keep_origin_dtype' keeps float32"),
    ({"atc_args": ["--precision_mode_v2=origin"]}, "--precision_mode_v2=origin: a high-precision mode"),
    ({"atc_args": ["--op_precision_mode=ops.ini"]}, "--op_precision_mode=ops.ini: a high-precision mode"),
])
def test_high_precision_modes_are_refused_for_the_int8_deploy_graph(build, message):
    """ATC's constraints for quantized models exclude the high-precision modes; the emulation models float16."""
    from quantflow.config import config_from_dict
    from quantflow.errors import ConfigError

    d = tomllib.loads((REPO / "quantflow.toml").read_text())
    d["build"].update(build)
    with pytest.raises(ConfigError) as e:
        config_from_dict(d, REPO)
    assert "build" in str(e.value) and message in str(e.value)
    d["build"]["atc_model"] = "fp32"   # the FP32 network may take them
    assert config_from_dict(d, REPO).build.atc_model == "fp32"


def test_the_default_is_float16_and_a_mixed_mode_is_noted(atc_stage, monkeypatch):
    from quantflow.config import config_from_dict

    d = tomllib.loads((REPO / "quantflow.toml").read_text())
    d["build"].pop("precision_mode", None)
    assert config_from_dict(d, REPO).build.precision_mode == "force_fp16"   # atc's own default
    b, run, kdir = atc_stage
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    write_export(kdir, air=False)
    assert run() is None and json.loads((kdir / "atc.json").read_text())["precision_note"] is None
    set_build(b, precision_mode="allow_fp32_to_fp16")
    assert run() is None
    note = json.loads((kdir / "atc.json").read_text())["precision_note"]
    assert "allow_fp32_to_fp16" in note and "modelled them in float16" in note
