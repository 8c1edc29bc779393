import tomllib
from pathlib import Path

import pytest

from quantflow.config import config_from_dict, load_config
from quantflow.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def demo_dict() -> dict:
    return tomllib.loads((REPO / "quantflow.toml").read_text())


def test_shipped_config_loads_with_defaults():
    cfg = load_config(REPO / "quantflow.toml")
    assert cfg.model.input_shape == (1, 3, 32, 32)
    assert cfg.build.soc_version == "Ascend310P3"
    assert cfg.calibration.method == "mse"
    assert cfg.path(cfg.calibration.data_dir) == REPO / "calib_data"
    assert cfg.out == REPO / "build"


def test_unknown_key_is_rejected_with_its_name():
    d = demo_dict()
    d["calibration"]["cout"] = 10
    with pytest.raises(ConfigError) as e:
        config_from_dict(d)
    assert "calibration.cout: unknown key" in str(e.value)


def test_unknown_top_level_section_is_rejected():
    d = demo_dict()
    d["quantise"] = {"bits": 8}
    with pytest.raises(ConfigError, match="quantise: unknown key"):
        config_from_dict(d)


@pytest.mark.parametrize("section,key,value,field", [
    ("calibration", "method", "average", "calibration.method"),
    ("calibration", "count", 0, "calibration.count"),
    ("calibration", "percentile", 40.0, "calibration.percentile"),
    ("evaluation", "threshold", 1.5, "evaluation.threshold"),
    ("normalization", "scale", "0-65535", "normalization.scale"),
    ("normalization", "std", [0.2, 0.0, 0.2], "normalization.std"),
    ("model", "entry", "no_colon_here", "model.entry"),
    ("model", "input_shape", [1, 3, 32], "model.input_shape"),
    ("build", "soc_version", "Kirin990", "build.soc_version"),
    ("build", "precision_mode", "int4", "build.precision_mode"),
    ("build", "atc_model", "int8sim", "build.atc_model"),
    ("model", "verify_images", 0, "model.verify_images"),
])
def test_invalid_values_name_the_field(section, key, value, field):
    d = demo_dict()
    d.setdefault(section, {})[key] = value
    with pytest.raises(ConfigError) as e:
        config_from_dict(d)
    assert f"  {field}" in str(e.value)


def test_missing_required_field():
    d = demo_dict()
    del d["model"]["input_shape"]
    with pytest.raises(ConfigError, match="model.input_shape: required but missing"):
        config_from_dict(d)


def test_each_metric_asks_for_its_own_settings():
    d = demo_dict()
    del d["model"]["num_classes"]
    with pytest.raises(ConfigError, match='model.num_classes is required with evaluation.metric = "top1"'):
        config_from_dict(d)
    d["evaluation"]["metric"] = "outputs"
    cfg = config_from_dict(d)  # no classes: the image folders are unlabelled
    assert cfg.labelled_classes is None and cfg.evaluation.min_cosine == 0.99
    del d["evaluation"]["threshold"]
    d["evaluation"]["metric"] = "top1"
    d["model"]["num_classes"] = 10
    with pytest.raises(ConfigError, match='evaluation.threshold is required with evaluation.metric = "top1"'):
        config_from_dict(d)
    d["evaluation"].update(metric="outputs", max_class_drop=0.02)
    with pytest.raises(ConfigError, match="max_class_drop is a top-1 setting"):
        config_from_dict(d)


def test_model_source_is_entry_and_checkpoint_or_a_mindir_or_an_onnx_file():
    d = demo_dict()
    del d["model"]["checkpoint"]
    with pytest.raises(ConfigError, match="give model.entry and model.checkpoint, or model.mindir, or model.onnx"):
        config_from_dict(d)
    d["model"]["mindir"] = "net.mindir"
    with pytest.raises(ConfigError, match="not model.entry and model.mindir"):
        config_from_dict(d)
    del d["model"]["entry"]
    with pytest.raises(ConfigError, match=r"\[train\] needs model.entry"):
        config_from_dict(d)
    del d["train"]
    cfg = config_from_dict(d, root="/r")
    assert cfg.path(cfg.model.mindir).as_posix() == "/r/net.mindir" and cfg.model.checkpoint is None
    d["model"]["checkpoint"] = "x.ckpt"
    with pytest.raises(ConfigError, match="give model.entry and model.checkpoint, or model.mindir, or model.onnx"):
        config_from_dict(d)
    del d["model"]["checkpoint"]
    d["model"]["onnx"] = "net.onnx"
    with pytest.raises(ConfigError, match="not model.mindir and model.onnx"):
        config_from_dict(d)
    del d["model"]["mindir"]
    cfg = config_from_dict(d, root="/r")
    assert cfg.path(cfg.model.onnx).as_posix() == "/r/net.onnx" and cfg.model.entry is None


def test_cross_field_consistency():
    d = demo_dict()
    d["model"]["input_shape"] = [1, 1, 32, 32]
    with pytest.raises(ConfigError, match="1 channel"):
        config_from_dict(d)
    d = demo_dict()
    d["calibration"]["per_class_min"] = 50
    with pytest.raises(ConfigError, match="cannot hold per_class_min=50"):
        config_from_dict(d)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\nentry = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_canonical_json_is_stable_and_sensitive():
    a = config_from_dict(demo_dict(), root="/x")
    b = config_from_dict(demo_dict(), root="/y")
    assert a.canonical_json() == b.canonical_json()  # the root directory is not part of the content
    d = demo_dict()
    d["evaluation"]["threshold"] = 0.02
    assert config_from_dict(d).canonical_json() != a.canonical_json()
