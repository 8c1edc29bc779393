"""What a user's model takes and returns (issue 21, issue 19's init point): a raw-pixel normalization is a
legitimate declaration while a wrong pixel domain is still caught, and ``quantflow init`` reads the input size of
dynamic dimensions off the calibration images, runs the network once at that size and chooses the gate from what
it really returns."""
from __future__ import annotations

import tomllib
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from quantflow.tasks.aipp import build_and_verify
from test_onnx_ops import crnn_style

from quantflow.cli.main import main
from quantflow.config import config_from_dict, load_config
from quantflow.data.images import scan_class_folders
from quantflow.errors import AippMismatchError, ConfigError

REPO = Path(__file__).resolve().parents[1]
CALIB = [i.path for i in scan_class_folders(REPO / "calib_data")][::30]


def demo_cfg(**normalization):
    d = tomllib.loads((REPO / "quantflow.toml").read_text())
    d["normalization"].update({"reference": None, **normalization})
    return config_from_dict(d, root=REPO)


# ----------------------------------------------------------------------------- raw pixels in, wrong domains caught

@pytest.mark.parametrize("mean", [[0.0, 0.0, 0.0], [104.0, 117.0, 123.0]])
def test_a_network_fed_raw_pixels_builds_its_aipp(tmp_path, mean):
    """mean 0 (or a Caffe mean), std 1, scale "0-255": the network takes pixel values; the AIPP config reproduces
    it and the check says so in a note, no error."""
    cfg = demo_cfg(mean=mean, std=[1.0, 1.0, 1.0], scale="0-255", channel_order="BGR")
    report = build_and_verify(cfg, CALIB, tmp_path / "aipp.cfg")
    assert report["images"] == min(len(CALIB), cfg.aipp.verify_images) and report["max_abs_diff"] == 0.0
    assert "raw pixel values" in report["note"]


@pytest.mark.parametrize("normalization, why", [
    ({"scale": "0-255"}, "0-1 domain with scale = \"0-255\""),                       # 0-1 mean/std, 0-255 scale
    # 0-255 mean/std with scale "0-1": the plausibility check, or the AIPP mean range (the mean is 30600 pixels)
    ({"mean": [120.0, 118.0, 119.0], "std": [65.0, 66.0, 66.0]}, "far from the ~0 / ~1|check normalization.scale"),
])
def test_mean_and_std_in_the_wrong_pixel_domain_are_still_caught(tmp_path, normalization, why):
    with pytest.raises((AippMismatchError, ConfigError), match=why):
        build_and_verify(demo_cfg(**normalization), CALIB, tmp_path / "aipp.cfg")


# ----------------------------------------------------------------------------- quantflow init

def write_images(folder: Path, count: int, h: int, w: int, gray: bool = False, classes: int = 0) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        sub = folder / str(i % classes) if classes else folder
        sub.mkdir(parents=True, exist_ok=True)
        shape = (h, w) if gray else (h, w, 3)
        cv2.imwrite(str(sub / f"{i}.png"), rng.integers(0, 256, shape, dtype=np.uint8))


def init(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "quantflow.toml"
    assert main(["init", *args, "-o", str(out)]) == 0
    load_config(out)
    return tomllib.loads(out.read_text())


def test_init_sizes_a_dynamic_input_from_the_images_and_gates_a_sequence_by_ctc(tmp_path):
    """A CRNN exported with a dynamic batch and width and a stale declared output [1, seqlen]: the width comes from
    the 8 x 40 calibration images, and the run at that size returns (20, 1, 12), a time-major sequence: ctc."""
    onnx.save(crnn_style()[0], tmp_path / "crnn.onnx")
    write_images(tmp_path / "calib", 6, 8, 40, gray=True)
    write_images(tmp_path / "eval", 4, 8, 40, gray=True)
    c = init(tmp_path, "--onnx", str(tmp_path / "crnn.onnx"), "--calib", str(tmp_path / "calib"),
             "--eval", str(tmp_path / "eval"))
    assert c["model"]["input_shape"] == [1, 1, 8, 40] and "num_classes" not in c["model"]
    assert c["evaluation"]["metric"] == "ctc" and c["evaluation"]["options"] == {"layout": "tnc"}
    assert c["calibration"]["count"] == 3   # half of the 6 images: the rest tune
    assert c["aipp"]["template"] == "static_yuv400_u8.cfg"
    text = (tmp_path / "quantflow.toml").read_text()
    assert "output [[20, 1, 12]]" in text and "dynamic height / width set from the calibration images" in text


def test_init_takes_an_input_shape_and_refuses_one_the_model_contradicts(tmp_path, capsys):
    onnx.save(crnn_style()[0], tmp_path / "crnn.onnx")
    c = init(tmp_path, "--onnx", str(tmp_path / "crnn.onnx"), "--input-shape", "1,1,8,64")
    assert c["model"]["input_shape"] == [1, 1, 8, 64]
    assert "output [[32, 1, 12]]" in (tmp_path / "quantflow.toml").read_text()
    assert main(["init", "--onnx", str(tmp_path / "crnn.onnx"), "--input-shape", "1,3,8,64",
                 "-o", str(tmp_path / "b.toml")]) == 2
    assert "--input-shape [1, 3, 8, 64]: the model's input is [None, 1, 8, None] (dimension 1 is 1)" in \
        capsys.readouterr().err


def classifier_onnx(path: Path, classes: int) -> None:
    """Conv -> GlobalAveragePool -> Flatten -> Gemm on a fully dynamic input (PaddleOCR's exports look so)."""
    rng = np.random.default_rng(1)
    weights = [numpy_helper.from_array(rng.normal(0, .3, (8, 3, 3, 3)).astype(np.float32), "w1"),
               numpy_helper.from_array(rng.normal(0, .3, (classes, 8)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"]), helper.make_node("GlobalAveragePool", ["c"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("Gemm", ["f", "w2"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "cls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "h", "w"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, classes])], weights)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_init_gives_a_classifier_the_top1_gate_and_a_valid_count_for_few_images(tmp_path):
    """One (batch, classes) output: top-1 with the model's class count; 6 images for 1000 classes still make a
    config that loads (per_class_min 0, marked EDIT) instead of failing."""
    classifier_onnx(tmp_path / "cls.onnx", 1000)
    write_images(tmp_path / "calib", 6, 48, 96, classes=3)
    c = init(tmp_path, "--onnx", str(tmp_path / "cls.onnx"), "--calib", str(tmp_path / "calib"))
    assert c["model"]["input_shape"] == [1, 3, 48, 96] and c["model"]["num_classes"] == 1000
    assert c["calibration"]["count"] == 3 and c["calibration"]["per_class_min"] == 0
    assert "EDIT: the folder holds 6 images for 1000 classes" in (tmp_path / "quantflow.toml").read_text()
    assert c.get("evaluation", {}).get("metric", "top1") == "top1"


def test_init_of_an_entry_network_reads_its_size_from_the_images_and_runs_it(tmp_path):
    """Issue 19: ``--entry`` + ``--checkpoint`` with 32 x 32 images: input [1, 3, 32, 32] (not 224), and the
    network's (1, 10) output gives the top-1 gate with 10 classes; the first build needs no shape edit."""
    import mindspore as ms

    from quantflow.demo.net import build
    ms.save_checkpoint(build(num_classes=10), str(tmp_path / "net.ckpt"))
    c = init(tmp_path, "--entry", "quantflow.demo.net:build", "--checkpoint", str(tmp_path / "net.ckpt"),
             "--calib", str(REPO / "calib_data"))
    assert c["model"]["input_shape"] == [1, 3, 32, 32] and c["model"]["num_classes"] == 10
    assert "output [[1, 10]]" in (tmp_path / "quantflow.toml").read_text()


def test_init_refuses_an_already_quantized_model(tmp_path, capsys):
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"], name="quant_in"),
             helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)]
    g = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(tmp_path / "q.onnx"))
    assert main(["init", "--onnx", str(tmp_path / "q.onnx"), "-o", str(tmp_path / "q.toml")]) == 2
    err = capsys.readouterr().err
    assert "is already quantized" in err and "the float (FP32) model" in err and not (tmp_path / "q.toml").exists()


def test_init_gives_an_output_that_is_no_three_stride_head_the_outputs_gate_without_parts(tmp_path):
    """The support detector's [1, 4 + classes, 64]: one stride-4 grid, not the anchors of YOLOv8's strides 8, 16,
    32 at 32 x 32 (21), so no YOLO parts are proposed (the loose shape test did: tests/test_heads.py has the
    recognised heads)."""
    from support import yolo_onnx

    onnx.save(yolo_onnx.detector(), tmp_path / "det.onnx")
    write_images(tmp_path / "calib", 4, yolo_onnx.SIZE, yolo_onnx.SIZE)
    write_images(tmp_path / "eval", 4, yolo_onnx.SIZE, yolo_onnx.SIZE)
    c = init(tmp_path, "--onnx", str(tmp_path / "det.onnx"), "--calib", str(tmp_path / "calib"),
             "--eval", str(tmp_path / "eval"))
    assert c["evaluation"]["metric"] == "outputs" and "parts" not in c["evaluation"]
