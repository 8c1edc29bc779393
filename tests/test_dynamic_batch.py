"""build.batch_sizes: deploy.onnx free in the batch (quantflow.backends.batch), the check that a batch computes what
its images compute alone, the atc command lines (through a stand-in atc, as tests/test_atc.py), and the
configuration's messages."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from support import deploy_interpreter, nets
from test_atc import fake_atc_on_path, set_build, write_export

from quantflow.backends.atc import atc_command
from quantflow.backends.batch import BATCH_DIM, batch_check, batch_free_axes, free_batch
from quantflow.backends.deploy_onnx import check_deploy, deploy_model
from quantflow.config import config_from_dict
from quantflow.engine.int8_emulator import keeps_every_step
from quantflow.engine.lowering import lower
from quantflow.errors import ConfigError, UnsupportedNetworkError
from quantflow.frontends.mindir import read_mindir
from quantflow.quantization.calibrater import calibrate
from quantflow.quantization.deploy import quantized_graph
from quantflow.quantization.passes import fold_for_quantization

REPO = Path(__file__).resolve().parents[1]


def demo_config(**build):
    d = tomllib.loads((REPO / "quantflow.toml").read_text())
    d["build"].update(build)
    return config_from_dict(d, REPO)


@pytest.fixture(scope="module")
def token_mlp(tmp_path_factory):
    """TokenMLP (exported at batch 2): Reshapes that merge the batch with the positions and back, a Transpose, a
    residual Add, Dense layers in INT8."""
    tmp = tmp_path_factory.mktemp("token_mlp")
    graph = fold_for_quantization(read_mindir(nets.export(nets.TokenMLP(), tmp / "t.mindir")))
    rng = np.random.default_rng(3)
    qp = calibrate(graph, [rng.normal(size=(16, 3, 16, 16)).astype(np.float32)], "minmax",
                   rollback_small_channels=False)
    return quantized_graph(graph, qp)


def test_deploy_onnx_is_free_in_the_batch_and_computes_what_the_static_one_does(token_mlp):
    static = deploy_model(token_mlp, "x")
    free = free_batch(static, "deploy.onnx")
    check_deploy(free)
    assert batch_free_axes(free) == {"x": 0, **{o.name: 0 for o in free.graph.output}}
    assert free.graph.input[0].type.tensor_type.shape.dim[0].dim_param == BATCH_DIM
    inits = {t.name: numpy_helper.to_array(t) for t in free.graph.initializer}
    targets = [inits[n.input[1]].tolist() for n in free.graph.node if n.op_type == "Reshape"]
    # images x positions rows (-1: the one entry that scales with the batch), back to maps, the head's own batch (0)
    assert targets == [[-1, 8], [-1, 4, 4, 8], [0, 128]]
    x = np.random.default_rng(5).normal(size=(8, 3, 16, 16)).astype(np.float16)
    at_static = np.concatenate([deploy_interpreter.run(static, x[i:i + 2])[0] for i in range(0, 8, 2)])
    at_one = np.concatenate([deploy_interpreter.run(free, x[i:i + 1])[0] for i in range(8)])
    at_eight = deploy_interpreter.run(free, x)[0]
    np.testing.assert_array_equal(at_one, at_static)
    np.testing.assert_array_equal(at_eight, at_static)


def test_the_emulation_at_the_largest_batch_equals_its_images_alone(token_mlp):
    emulation = free_batch(lower(token_mlp, "float16"), "emulation")
    x = np.random.default_rng(6).normal(size=(5, 3, 16, 16))
    report = batch_check(emulation, x, 16, keeps_every_step(emulation))
    assert report["identical"] and report["worst"] is None and report["batch"] == 16 and report["images"] == 5
    assert all(o["differing"] == 0 and o["max_abs_diff"] == 0.0 for o in report["outputs"].values())


def batch_mixing_model() -> onnx.ModelProto:
    """y = x - mean over the batch: every sample's output depends on the others (written free in the batch)."""
    mean = helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1)
    sub = helper.make_node("Sub", ["x", "m"], ["y"], name="centre")
    g = helper.make_graph([mean, sub], "mixing", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_the_check_catches_a_batch_dependent_graph_naming_the_output():
    x = np.random.default_rng(0).normal(size=(3, 4))
    report = batch_check(batch_mixing_model(), x, 8)
    assert not report["identical"] and report["worst"] == "y"
    assert report["outputs"]["y"]["differing"] > 0 and report["outputs"]["y"]["max_abs_diff"] > 0.1


def test_the_export_stage_refuses_a_batch_dependent_graph_naming_output_and_difference():
    from quantflow.tasks.export import check_free_batch

    cfg = demo_config(batch_sizes=[1, 4])
    paths = sorted((REPO / "calib_data").rglob("*.png"))[:4]
    mixing = batch_mixing_model()
    mixing.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 3 * 32 * 32
    mixing.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 3 * 32 * 32
    flat = helper.make_node("Reshape", ["img", "flat_shape"], ["x"])
    mixing.graph.node.insert(0, flat)
    mixing.graph.initializer.append(numpy_helper.from_array(np.array([-1, 3 * 32 * 32], np.int64), "flat_shape"))
    mixing.graph.input[0].name = "img"
    del mixing.graph.input[0].type.tensor_type.shape.dim[1:]
    for d in (3, 32, 32):
        mixing.graph.input[0].type.tensor_type.shape.dim.add().dim_value = d
    with pytest.raises(UnsupportedNetworkError) as e:
        check_free_batch(mixing, cfg, paths, "deploy.onnx (INT8 emulation)", np.float32)
    msg = str(e.value)
    assert "at batch 4 output 'y' differs from the same 4 images run one at a time" in msg
    assert "largest difference" in msg and "build.batch_sizes cannot be used" in msg


def static_model(nodes, inits, shape_in, shape_out) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape_in)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape_out)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("nodes,inits,shape_out,message", [
    ([helper.make_node("Concat", ["x", "c"], ["y"], name="join", axis=0)], {"c": np.zeros((1, 4), np.float32)},
     [3, 4], "node 'join' (Concat) works along the batch axis"),
    ([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"], name="first")],
     {"s": np.array([0]), "e": np.array([1]), "a": np.array([0])}, [1, 4],
     "node 'first' (Slice) slices part of the batch"),
    ([helper.make_node("Add", ["x", "c"], ["y"], name="per_image_bias")], {"c": np.ones((2, 4), np.float32)},
     [2, 4], "'c' of shape [2, 4], which spans the batch axis"),
])
def test_a_graph_that_cannot_be_free_in_the_batch_is_refused_naming_the_node(nodes, inits, shape_out, message):
    with pytest.raises(UnsupportedNetworkError) as e:
        free_batch(static_model(nodes, inits, [2, 4], shape_out), "deploy.onnx")
    assert str(e.value).startswith("deploy.onnx: ") and message in str(e.value)


def test_a_slice_of_the_whole_batch_runs_to_the_end():
    nodes = [helper.make_node("Slice", ["x", "s", "e", "a"], ["y"], name="all")]
    free = free_batch(static_model(nodes, {"s": np.array([0]), "e": np.array([2]), "a": np.array([0])}, [2, 4],
                                   [2, 4]), "g")
    ends = next(numpy_helper.to_array(t) for t in free.graph.initializer if t.name.startswith("e__"))
    assert ends.tolist() == [np.iinfo(np.int64).max]


# ----------------------------------------------------------------------------- atc

def test_atc_command_with_batch_profiles(tmp_path):
    cmd = atc_command(Path("/opt/atc"), tmp_path / "graph.onnx", 5, tmp_path / "model", "Ascend310P3",
                      tmp_path / "aipp.cfg", "force_fp16", "x", (1, 3, 32, 32), (), (1, 8, 16))
    assert cmd == ["/opt/atc", f"--model={tmp_path}/graph.onnx", "--framework=5", f"--output={tmp_path}/model",
                   "--soc_version=Ascend310P3", f"--insert_op_conf={tmp_path}/aipp.cfg",
                   "--precision_mode=force_fp16", "--input_shape=x:-1,3,32,32", "--dynamic_batch_size=1,8,16"]


@pytest.fixture
def stand_in_atc(tmp_path, monkeypatch):
    """A stand-in atc on PATH (tests/test_atc.py's) and the atc stage on one prepared folder: (build, run, folder,
    the log of atc's calls)."""
    from quantflow.pipeline import doit_graph
    from quantflow.pipeline.build import Build
    from quantflow.tasks import STAGES

    _, log = fake_atc_on_path(tmp_path, monkeypatch)
    kdir = tmp_path / "build" / "artifacts" / "k"
    kdir.mkdir(parents=True)
    (kdir / "aipp.cfg").write_text("aipp_op {\n}\n")

    class OneFolder(Build):
        def dir(self, name, create=True):
            return kdir

    b = OneFolder(config_from_dict(tomllib.loads((REPO / "quantflow.toml").read_text()), root=tmp_path))
    monkeypatch.setitem(doit_graph._bound, "build", b)
    return b, doit_graph._action(STAGES["atc"]), kdir, log


def test_int8_batch_sizes_build_one_static_om_per_size_from_the_onnx(stand_in_atc):
    b, run, kdir, log = stand_in_atc
    set_build(b, batch_sizes=(1, 8, 16))
    write_export(kdir, air=True)   # the deploy AIR is static in the batch: the ONNX is converted
    assert run() is None
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c[0] for c in calls] == [f"--model={kdir / 'deploy.onnx'}"] * 3
    assert [c[-1] for c in calls] == ["--input_shape=x:1,3,32,32", "--input_shape=x:8,3,32,32",
                                      "--input_shape=x:16,3,32,32"]
    assert not any(a.startswith("--dynamic_batch_size") for c in calls for a in c)
    status = json.loads((kdir / "atc.json").read_text())
    assert status["oms"] == {"1": "model_b1.om", "8": "model_b8.om", "16": "model_b16.om"}
    assert status["om"] == "model_b1.om" and status["framework"] == 5 and len(status["commands"]) == 3
    assert all((kdir / om).is_file() for om in status["oms"].values())
    from quantflow.tasks import STAGES
    assert STAGES["atc"].summary(b)["oms"]["16"] == str(kdir / "model_b16.om")


def test_fp32_batch_sizes_build_one_om_with_atc_batch_profiles(stand_in_atc):
    b, run, kdir, log = stand_in_atc
    set_build(b, batch_sizes=(1, 8, 16), atc_model="fp32")
    write_export(kdir, air=True)
    assert run() is None
    (call,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert call[0] == f"--model={kdir / 'graph.onnx'}" and call[1] == "--framework=5"
    assert call[-2:] == ["--input_shape=x:-1,3,32,32", "--dynamic_batch_size=1,8,16"]
    assert f"--insert_op_conf={kdir / 'aipp.cfg'}" in call   # static AIPP stays with the batch profiles
    assert json.loads((kdir / "atc.json").read_text())["oms"] == {"1,8,16": "model.om"}


# ----------------------------------------------------------------------------- configuration and keys

@pytest.mark.parametrize("build,message", [
    ({"batch_sizes": [8]}, "build.batch_sizes: 1 batch size(s): atc takes 2 to 100 batch-size profiles"),
    ({"batch_sizes": list(range(1, 102))}, "101 batch size(s): atc takes 2 to 100"),
    ({"batch_sizes": [0, 4]}, "build.batch_sizes: batch size(s) [0] outside atc's range 1..2048"),
    ({"batch_sizes": [1, 4096]}, "batch size(s) [4096] outside atc's range 1..2048"),
    ({"batch_sizes": [16, 8]}, "build.batch_sizes: [16, 8]: list each batch size once, in increasing order"),
    ({"batch_sizes": [8, 8]}, "list each batch size once"),
    ({"batch_sizes": [1, 8], "atc_model": "fp32", "atc_args": ["--dynamic_batch_size=1,8"]},
     "build.batch_sizes: --dynamic_batch_size in build.atc_args: quantflow passes the batch sizes to atc itself"),
    ({"atc_args": ["--dynamic_batch_size=1,8"]}, "build.batch_sizes builds one INT8 .om per batch size"),
])
def test_bad_batch_sizes_are_refused_naming_the_field(build, message):
    with pytest.raises(ConfigError) as e:
        demo_config(**build)
    assert message in str(e.value)


def test_batch_sizes_are_in_the_keys_of_the_stages_whose_outputs_they_change():
    from quantflow.tasks import STAGES

    def key(stage, **build):
        return STAGES[stage].key_inputs(SimpleNamespace(cfg=demo_config(**build), manifest_digest=lambda: "m"))

    assert key("export") != key("export", batch_sizes=[1, 16]) != key("export", batch_sizes=[1, 8])
    assert key("atc", batch_sizes=[1, 16])["build"]["batch_sizes"] == [1, 16]
    assert key("atc")["build"]["batch_sizes"] == []
    assert demo_config(batch_sizes=[1, 8, 16]).build.batch_sizes == (1, 8, 16)


@pytest.mark.parametrize("free", [True, False], ids=["batch-free", "batch-1"])
def test_init_offers_batch_sizes_where_the_file_leaves_the_batch_free(tmp_path, free):
    """A recogniser exported with a free batch (PP-OCR's cls and rec, NudeNet) gets build.batch_sizes written,
    commented out; uncommented, the configuration holds it.  A file fixed at batch 1 gets no such line."""
    import cv2
    from support.project import tiny_onnx

    from quantflow.config import load_config
    from quantflow.scaffold import write

    path = tmp_path / "m.onnx"
    tiny_onnx(path)
    if not free:
        model = onnx.load(str(path))
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
        onnx.save(model, str(path))
    rng = np.random.default_rng(0)
    for folder in ("calib", "eval"):
        (tmp_path / folder).mkdir()
        for k in range(4):
            cv2.imwrite(str(tmp_path / folder / f"{k}.png"), rng.integers(0, 255, (32, 32, 3)).astype(np.uint8))
    out, _ = write(tmp_path / "quantflow.toml", onnx=path, calib=tmp_path / "calib", eval=tmp_path / "eval")
    text = out.read_text()
    assert load_config(out).build.batch_sizes == ()
    line = "# batch_sizes = [1, 8, 16]"
    assert (line in text) == free
    if free:
        out.write_text(text.replace(line, line[2:]))
        assert load_config(out).build.batch_sizes == (1, 8, 16)
