"""Networks with inputs other than the image (``[model.inputs]``): a PaddleDetection-style detector taking ``image``
and ``scale_factor`` (its boxes multiplied by the scale), with a constant output ``box_scale``: read, run,
calibrated, emulated, written as a deploy graph with both inputs, converted by atc with both in --input_shape,
written by ``quantflow init``, and built end to end."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.device_standin import check_dump, standin_om, use_standin
from support.project import init_onnx_project

import quantflow
from quantflow.backends.aipp import check_input_rank
from quantflow.backends.atc import atc_command
from quantflow.backends.deploy_onnx import check_deploy, deploy_model
from quantflow.cli.main import main
from quantflow.config import ModelSection, load_config
from quantflow.data.extra_inputs import guess, sample_value
from quantflow.engine.int8_emulator import Emulator
from quantflow.engine.runner import float_runner
from quantflow.errors import AippMismatchError, UnsupportedNetworkError
from quantflow.frontends.onnx_model import read_onnx
from quantflow.frontends.source import onnxruntime_outputs
from quantflow.quantization.calibrater import calibrate
from quantflow.quantization.deploy import quantized_graph
from quantflow.quantization.passes import fold_for_quantization
from quantflow.tasks.atc import other_inputs
from quantflow.tasks.summary import latest_path

SIZE = 32
SHAPE = (1, 3, SIZE, SIZE)
SCALE = [2.0, 0.5]


def two_input_detector(path, constant_output: bool = True) -> None:
    """image [N, 3, 32, 32] -> Conv 4x4/4 -> Relu -> Conv 1x1 -> Relu -> Flatten -> Gemm: boxes [N, 4, 4] multiplied
    by [sx, sy, sx, sy] from scale_factor [N, 2]; Gemm: scores [N, 10]; a Constant box_scale [2] (seeded weights,
    a dynamic batch as exporters write it)."""
    rng = np.random.default_rng(0)
    side = SIZE // 4

    def weight(name, *shape):
        return numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)

    inits = [weight("w1", 24, 3, 4, 4), weight("w2", 24, 24, 1, 1), weight("wb", 16, 24 * side * side),
             weight("ws", 10, 24 * side * side), numpy_helper.from_array(np.array([-1, 4, 4], np.int64), "box_shape"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    nodes = [helper.make_node("Conv", ["image", "w1"], ["c1"], strides=[4, 4]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"]), helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]), helper.make_node("Gemm", ["f", "wb"], ["braw"], transB=1),
             helper.make_node("Reshape", ["braw", "box_shape"], ["b3"]),
             helper.make_node("Concat", ["scale_factor", "scale_factor"], ["s4"], axis=1),
             helper.make_node("Unsqueeze", ["s4", "axis1"], ["s14"]),
             helper.make_node("Mul", ["b3", "s14"], ["boxes"]),
             helper.make_node("Gemm", ["f", "ws"], ["scores"], transB=1)]
    outputs = [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["batch", 4, 4]),
               helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 10])]
    if constant_output:
        nodes.append(helper.make_node("Constant", [], ["box_scale"],
                                      value=numpy_helper.from_array(np.array([8.0, 16.0], np.float32))))
        outputs.append(helper.make_tensor_value_info("box_scale", TensorProto.FLOAT, [2]))
    graph = helper.make_graph(nodes, "det2", [
        helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, SIZE, SIZE]),
        helper.make_tensor_value_info("scale_factor", TensorProto.FLOAT, ["batch", 2])], outputs, inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("det2") / "det.onnx"
    two_input_detector(path)
    return path


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(1).random((6, 3, SIZE, SIZE), np.float32)


def _read(model):
    return read_onnx(model, input_shape=SHAPE, extra_inputs={"scale_factor": SCALE})


def test_the_extra_input_stays_an_input_with_its_value_and_the_image_comes_first(model):
    g = _read(model)
    assert g.inputs == ["image", "scale_factor"] and g.image_input == "image"
    assert g.tensors["scale_factor"].shape == (1, 2)
    np.testing.assert_array_equal(g.fixed_inputs["scale_factor"], np.array(SCALE, np.float32))
    assert list(g.constant_outputs) == ["box_scale"] and len(g.outputs) == 2   # reported, not refused
    np.testing.assert_array_equal(g.constant_outputs["box_scale"], [8.0, 16.0])


def test_the_float_run_feeds_the_value_and_matches_onnxruntime_on_the_file(model, images):
    g = _read(model)
    got = float_runner(g).run(images)
    want = onnxruntime_outputs(model, images, 1, fixed_inputs=g.fixed_inputs)   # the graph stage's reference
    np.testing.assert_allclose(got[g.outputs[0]], want, rtol=1e-5, atol=1e-5)
    unscaled = read_onnx(model, input_shape=SHAPE, extra_inputs={"scale_factor": [1.0, 1.0]})
    plain = float_runner(unscaled).run(images)[g.outputs[0]]
    np.testing.assert_allclose(got[g.outputs[0]], plain * np.array(SCALE * 2, np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("extra, said", [
    (None, "add them to [model.inputs], e.g. scale_factor = { value = [1.0, 1.0] }"),
    ({"scale_factor": [1.0, 2.0, 3.0]}, "model.inputs.scale_factor.value has shape [3], which does not fit the "
                                        "input's per-image shape [2]"),
    ({"scale": [1.0, 1.0]}, "model.inputs.scale names no input of the model (its inputs: 'image', 'scale_factor')"),
    ({"scale_factor": [1.0, 1.0], "image": [0.0]}, "model.inputs gives a value for every input"),
])
def test_a_model_whose_inputs_the_configuration_does_not_fit_is_refused_naming_them(model, extra, said):
    with pytest.raises(UnsupportedNetworkError) as err:
        read_onnx(model, input_shape=SHAPE, extra_inputs=extra)
    assert said in str(err.value) and str(model) in str(err.value)


def test_a_value_is_broadcast_to_the_declared_shape_or_gives_it():
    assert sample_value("s", 1.0, ["batch", 2], "float32", "m.onnx").tolist() == [1.0, 1.0]
    assert sample_value("s", [[1.0, 2.0]], [1, "a", "b"], "float32", "m.onnx").shape == (1, 2)
    with pytest.raises(UnsupportedNetworkError, match="input 's' .* is int64; quantflow feeds float inputs"):
        sample_value("s", [1, 2], ["batch", 2], "int64", "m.onnx")


def test_calibration_the_emulation_and_the_deploy_graph_take_both_inputs(model, images, tmp_path):
    g = fold_for_quantization(_read(model))
    qp = calibrate(g, [images[:3], images[3:]], "minmax")
    assert {q.node for q in qp.ops} >= {n.name for n in g.nodes if n.op == "MatMul"}
    deploy = quantized_graph(g, qp)
    int8, fp32 = Emulator(deploy).outputs(images), float_runner(g).run(images)
    for o in g.outputs:
        cosine = np.dot(int8[o].ravel(), fp32[o].ravel()) / np.linalg.norm(int8[o]) / np.linalg.norm(fp32[o])
        assert cosine > 0.999
    written = check_deploy(deploy_model(deploy, "image"))
    assert [(i.name, [d.dim_value for d in i.type.tensor_type.shape.dim]) for i in written.graph.input] == \
        [("image", list(SHAPE)), ("scale_factor", [1, 2])]
    assert [o.name for o in written.graph.output][-1] == "box_scale"     # the constant kept, after the others
    onnx.save(written, str(tmp_path / "deploy.onnx"))
    assert other_inputs(tmp_path / "deploy.onnx", 5) == {"scale_factor": [1, 2]}
    assert other_inputs(tmp_path / "deploy.onnx", 1) == {}


def test_atc_names_every_input_in_input_shape():
    cmd = atc_command("atc", "deploy.onnx", 5, "out/model", "Ascend310P3", "aipp.cfg", "force_fp16", "image",
                      SHAPE, other_inputs={"scale_factor": [1, 2]})
    assert "--input_shape=image:1,3,32,32;scale_factor:1,2" in cmd and "--insert_op_conf=aipp.cfg" in cmd


def test_aipp_applies_to_the_image_input_only():
    check_input_rank({"related_input_rank": "0"}, "aipp.cfg")
    check_input_rank({}, "aipp.cfg")
    with pytest.raises(AippMismatchError, match="aipp.cfg: related_input_rank is 1; AIPP feeds the image input"):
        check_input_rank({"related_input_rank": "1"}, "aipp.cfg")


def test_the_configuration_takes_model_inputs_for_onnx_only():
    m = ModelSection(onnx="det.onnx", input_shape=SHAPE, input_name="image",
                     inputs={"scale_factor": {"value": SCALE}})
    assert m.inputs["scale_factor"].value == SCALE
    with pytest.raises(ValueError, match="model.inputs \\(scale_factor\\) applies to model.onnx only"):
        ModelSection(mindir="m.mindir", input_shape=SHAPE, inputs={"scale_factor": {"value": SCALE}})
    with pytest.raises(ValueError, match="model.inputs.image: model.input_name 'image' names the image input"):
        ModelSection(onnx="det.onnx", input_shape=SHAPE, input_name="image", inputs={"image": {"value": 1.0}})


def test_init_guesses_values_from_the_names():
    assert guess("scale_factor", [1, 2], (32, 48)) == ([1.0, 1.0], True)
    assert guess("im_shape", [1, 2], (32, 48)) == ([32.0, 48.0], True)
    assert guess("mask", [1, 3], (32, 48)) == ([0.0, 0.0, 0.0], False)


def _init_two_input_project(tmp_path: Path) -> Path:
    """The tiny project with the two-input detector, its quantflow.toml written as quantflow init writes it."""
    return init_onnx_project(tmp_path / "p", "det.onnx", two_input_detector)


def test_init_writes_the_inputs_table_and_the_build_reads_it(tmp_path):
    out = _init_two_input_project(tmp_path)
    text = out.read_text()
    assert "scale_factor = { value = [1.0, 1.0] }   # EDIT" in text
    written = tomllib.loads(text)
    assert written["model"]["input_name"] == "image"
    assert written["model"]["inputs"] == {"scale_factor": {"value": [1.0, 1.0]}}
    assert load_config(out).model.inputs["scale_factor"].value == [1.0, 1.0]


@pytest.mark.parametrize("atc_model,commands", [
    ("int8", ["image:1,3,32,32;scale_factor:1,2", "image:4,3,32,32;scale_factor:4,2"]),   # one static .om each
    ("fp32", ["image:-1,3,32,32;scale_factor:-1,2 --dynamic_batch_size=1,4"])])
def test_batch_sizes_free_every_input_and_name_each_at_the_batch_for_atc(tmp_path, monkeypatch, atc_model, commands):
    """build.batch_sizes with model.inputs: deploy.onnx (graph.onnx for an FP32 .om) is free in the batch of both
    inputs and of the computed outputs, the constant output keeps its shape, the batch check feeds scale_factor at
    the largest batch, and atc names scale_factor at each .om's batch (-1 with batch profiles)."""
    from test_atc import fake_atc_on_path

    _, log = fake_atc_on_path(tmp_path, monkeypatch)
    out = _init_two_input_project(tmp_path)
    line = "# batch_sizes = [1, 8, 16]"   # init offers it: the file's batch is free
    assert line in out.read_text()
    out.write_text(out.read_text().replace(line, f'batch_sizes = [1, 4]\natc_model = "{atc_model}"', 1))
    r = quantflow.build(out)
    assert r.passed is True
    export = Path(r.artifacts["export"])
    status = json.loads((export / "export.json").read_text())
    check = status["batch_check" if atc_model == "int8" else "fp32_batch_check"]
    assert check["batch"] == 4 and check["identical"] is True
    assert ("box_scale" in check["outputs"]) == (atc_model == "fp32")   # graph.onnx keeps it; the emulation not
    model = onnx.load(str(export / ("deploy.onnx" if atc_model == "int8" else "graph.onnx")))
    dims = {vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in list(model.graph.input) + list(model.graph.output)}
    assert dims["image"] == ["batch", 3, SIZE, SIZE] and dims["scale_factor"] == ["batch", 2]
    assert dims["box_scale"] == [2] and all(d[0] == "batch" for k, d in dims.items() if k != "box_scale")
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [" ".join(a for a in c if a.startswith(("--input_shape", "--dynamic_batch_size"))) for c in calls] == \
        [f"--input_shape={c}" for c in commands]


@pytest.fixture(scope="module")
def built_two_input(tmp_path_factory):
    """The two-input detector's project, as init writes it with SCALE for scale_factor, built: (config, result)."""
    out = _init_two_input_project(tmp_path_factory.mktemp("built"))
    out.write_text(out.read_text().replace("scale_factor = { value = [1.0, 1.0] }", f"scale_factor = {{ value = "
                                                                                    f"{SCALE} }}"))
    return out, quantflow.build(out)


def test_a_two_input_detector_builds_and_passes_its_gate(built_two_input):
    _, r = built_two_input
    assert r.passed is True and r.verdict == "PASS"
    assert {row["output"] for row in r.report["outputs"]} == {"boxes", "scores"}   # the constant is not gated
    deploy = onnx.load(str(r.artifacts["deploy_onnx"]))
    assert [i.name for i in deploy.graph.input] == ["image", "scale_factor"]
    assert [o.name for o in deploy.graph.output][-1] == "box_scale"
    graph_info = json.loads((r.artifacts["graph"] / "graph.json").read_text())   # what the graph stage reported
    assert graph_info["constant_outputs"] == {"box_scale": [2]} and graph_info["fixed_inputs"] == {"scale_factor": SCALE}
    assert graph_info["fixed_inputs_reach"] == {"scale_factor": []}   # it only scales the boxes after the Gemm


def test_downstream_names_what_an_input_reaches(model):
    g = _read(model)
    assert [n.op for n in g.downstream(["scale_factor"])] == ["Concat", "ExpandDims", "Mul"]   # the boxes' scale
    ops = [n.op for n in g.downstream(["image"])]
    assert "Conv2D" in ops and "MatMul" in ops and len(g.downstream(["image"])) > len(g.downstream(["scale_factor"]))


def test_verify_and_dump_feed_the_om_every_input(built_two_input, tmp_path, monkeypatch):
    """On the Ascend host's side (ais_bench's stand-in): verify feeds the .om the frames and scale_factor, in its
    input order, and agrees with the emulation; dump writes one folder per input for ais_bench and goldens that
    the deploy graph computes from them."""
    use_standin(monkeypatch)
    config, r = built_two_input
    build = json.loads(latest_path(r.config).read_text())
    om = standin_om(tmp_path, build)
    assert main(["verify", str(config), "--om", str(om), "--images", "8"]) == 0
    report = json.loads((Path(build["artifacts"]["gate"]) / "device_verify.json").read_text())
    # every output of the .om, the constant box_scale last, is what the emulation computed, bit for bit
    om_outputs = [o.name for o in onnx.load(build["deploy_onnx"]).graph.output]
    assert [o["output"] for o in report["outputs"]] == om_outputs and om_outputs[-1] == "box_scale"
    assert all(o["cosine"] == 1.0 and o["max_abs_diff"] == 0.0 for o in report["outputs"]) and report["passed"]
    out = tmp_path / "dump"
    assert main(["dump", str(config), "-o", str(out)]) == 0
    listing = json.loads((out / "dump.json").read_text())
    assert [(d["input"], d["file"], d["dtype"], d["shape"]) for d in listing["device_inputs"]][1:] == \
        [("scale_factor", "input/1_scale_factor/scale_factor.bin", "float32", [1, 2])]
    np.testing.assert_array_equal(np.fromfile(out / "input/1_scale_factor/scale_factor.bin", np.float32), SCALE)
    assert f"--input {out / 'input/0_frames'},{out / 'input/1_scale_factor'} " in listing["device_dump"]
    assert check_dump(out, build) > 0
