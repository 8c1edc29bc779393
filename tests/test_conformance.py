"""What quantflow exports is what CANN compiles: the deploy.onnx and deploy MindIR of the shipped demo (from a
`doit` build) and of several model-zoo families follow the rules of CANN's quant passes and ONNX plugins
(tests/support/conformance.py), and the record and qparams artifacts say which layers are INT8 and why."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
from support import conformance

from quantflow.backends.atc import atc_command
from quantflow.backends.deploy_mindspore import export_deploy_mindir
from quantflow.backends.deploy_onnx import deploy_model, record_text
from quantflow.config import config_from_dict
from quantflow.engine.lowering import lower
from quantflow.frontends.mindir import read_mindir
from quantflow.quantization.calibrater import calibrate, quantizable_nodes
from quantflow.quantization.deploy import quantized_graph
from quantflow.quantization.passes import fold_for_quantization

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def test_the_demo_build_conforms(built_demo):
    latest = json.loads((built_demo[0] / "build" / "latest.json").read_text())
    dirs = {k: Path(v) for k, v in latest["artifacts"].items()}
    meta = json.loads((dirs["fallback"] / "qparams.json").read_text())
    int8 = [e["scope"] for e in meta["ops"] if e["device_precision"] == "int8"]
    assert conformance.check_deploy_onnx(onnx.load(str(dirs["export"] / "deploy.onnx"))) == len(int8) == 4
    back = read_mindir(dirs["export"] / "deploy.mindir")
    assert conformance.check_deploy_mindir(back, (dirs["export"] / "deploy_net.py").read_text()) == 4
    conformance.check_record((dirs["export"] / "record.txt").read_text(), onnx.load(str(dirs["graph"] / "graph.onnx")),
                             int8)
    graph = fold_for_quantization(read_mindir(dirs["graph"] / "model.mindir"))
    conformance.check_qparams(meta, len(quantizable_nodes(graph)))
    # DigitsNet: the stem reads 3 channels, so CANN rolls it back; the convolutions after it (24 and 32 channels)
    # and the two Dense layers are INT8
    assert [e["op"] for e in meta["ops"] if e["device_precision"] == "float16"] == ["Conv2D"]
    assert [e["op"] for e in meta["ops"] if e["device_precision"] == "int8"] == ["Conv2D", "Conv2D", "MatMul", "MatMul"]
    calibration = (dirs["calibrate"] / "calibration.txt").read_text()
    assert "left in float16 on the device (1)" in calibration and "input channels <= 16" in calibration


@pytest.mark.parametrize("arch,int8_min", [("resnet18", 19), ("mobilenet_v3_small_100", 30),
                                           ("efficientnet_b0", 60)])
def test_zoo_families_conform(arch, int8_min, tmp_path):
    from benchmarks.zoo import create, randomize
    from quantflow.backends.export import export_mindir

    path = export_mindir(randomize(create(arch)), (1, 3, 64, 64), tmp_path / f"{arch}.mindir")
    folded = fold_for_quantization(read_mindir(path))
    x = np.random.default_rng(0).normal(size=(4, 3, 64, 64)).astype(np.float32)
    qp = calibrate(folded, [x[i:i + 1] for i in range(4)], "minmax")
    assert len(qp.ops) >= int8_min and qp.float16          # the stem (3 channels) at least is rolled back
    deploy = quantized_graph(folded, qp)
    assert conformance.check_deploy_onnx(deploy_model(deploy, "x")) == len(qp.ops)
    export_deploy_mindir(deploy, tmp_path)
    back = read_mindir(tmp_path / "deploy.mindir")
    assert conformance.check_deploy_mindir(back, (tmp_path / "deploy_net.py").read_text()) == len(qp.ops)
    conformance.check_record(record_text(qp), lower(read_mindir(path), "float32", input_name="x"),
                             [q.scope for q in qp.ops])


def test_atc_runs_the_int8_graph_in_the_precision_the_emulation_models(tmp_path):
    cfg = config_from_dict(tomllib.loads((REPO / "quantflow.toml").read_text()), root=REPO)
    assert cfg.build.precision_mode == "force_fp16"
    cmd = atc_command(Path("atc"), Path("deploy.onnx"), 5, tmp_path / "m", cfg.build.soc_version, None,
                      cfg.build.precision_mode, "x", cfg.model.input_shape)
    assert "--precision_mode=force_fp16" in cmd
