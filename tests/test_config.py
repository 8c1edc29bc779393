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
    with pytest.raises(ConfigError, match="model.checkpoint is required with model.entry = 'quantflow.demo.net:build'"):
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
    with pytest.raises(ConfigError, match="model.checkpoint = 'x.ckpt' needs model.entry .*, not model.mindir"):
        config_from_dict(d)
    del d["model"]["mindir"]
    with pytest.raises(ConfigError, match="model.checkpoint = 'x.ckpt' needs model.entry"):
        config_from_dict(d)
    del d["model"]["checkpoint"]
    with pytest.raises(ConfigError, match="give the network: model.entry and model.checkpoint, or model.mindir, or "
                                          "model.onnx"):
        config_from_dict(d)
    d["model"]["mindir"] = "net.mindir"
    d["model"]["checkpoint"] = "x.ckpt"
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
    with pytest.raises(ConfigError, match="calibration.count = 200 cannot hold calibration.per_class_min = 50"):
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


# ----------------------------------------------------------------------------- every field's bad values
# (section, key, bad value, text the message must hold besides the field); the message names the field and the
# value as written, on one line, and never quotes a whole section

BAD_VALUES = [
    ("model", "input_shape", [1, 3, 32], "too few values (got [1, 3, 32])"),
    ("model", "input_shape", [1, 3, 32, 32, 1], "at most 4 items"),
    ("model", "input_shape", "32x32", "got '32x32'"),
    ("model", "input_shape", [1, 3.5, 32, 32], "got [1, 3.5, 32, 32]"),
    ("model", "input_shape", [0, 3, 32, 32], "every dimension must be positive"),
    ("model", "input_shape", [1, 2, 32, 32], "channels must be 1 or 3"),
    ("model", "input_name", 7, "got 7"),
    ("model", "num_classes", 1, "greater than 1 (got 1)"),
    ("model", "num_classes", "ten", "got 'ten'"),
    ("model", "entry", "no_colon_here", "got 'no_colon_here'"),
    ("model", "entry", ":build", "got ':build'"),
    ("model", "checkpoint", 3, "got 3"),
    ("model", "verify_images", 0, "got 0"),
    ("model", "verify_images", 1000, "got 1000"),
    ("model", "verify_tolerance", 0, "got 0"),
    ("model", "verify_tolerance", "big", "got 'big'"),
    ("normalization", "mean", [0.5, 0.5], "normalization.mean has 2 values but normalization.std has 3"),
    ("normalization", "mean", "0.5", "got '0.5'"),
    ("normalization", "std", [0.2, 0.0, 0.2], "every std must be > 0"),
    ("normalization", "std", [0.2, "x", 0.2], "got [0.2, 'x', 0.2]"),
    ("normalization", "scale", "0-65535", "got '0-65535'"),
    ("normalization", "channel_order", "RGBA", "got 'RGBA'"),
    ("normalization", "reference", "preprocess", "got 'preprocess'"),
    ("calibration", "data_dir", 5, "must be a path (a string) (got 5)"),
    ("calibration", "count", 0, "got 0"),
    ("calibration", "count", -5, "got -5"),
    ("calibration", "count", "many", "got 'many'"),
    ("calibration", "per_class_min", -1, "got -1"),
    ("calibration", "seed", -1, "got -1"),
    ("calibration", "method", "average", "got 'average'"),
    ("calibration", "percentile", 40.0, "got 40.0"),
    ("calibration", "percentile", 101, "got 101"),
    ("calibration", "kl_max_clipped", 2, "got 2"),
    ("calibration", "histogram_bins", 10, "got 10"),
    ("calibration", "batch_size", 0, "got 0"),
    ("calibration", "on_bad_image", "ignore", "got 'ignore'"),
    ("evaluation", "data_dir", ["a", "b"], "got ['a', 'b']"),
    ("evaluation", "threshold", 1.5, "got 1.5"),
    ("evaluation", "threshold", -0.1, "got -0.1"),
    ("evaluation", "threshold", "1%", "got '1%'"),
    ("evaluation", "metric", "map", "got 'map'"),
    ("evaluation", "min_cosine", 0, "got 0"),
    ("evaluation", "batch_size", 0, "got 0"),
    ("evaluation", "max_class_drop", 2, "got 2"),
    ("evaluation", "allow_missing_classes", "maybe", "got 'maybe'"),
    ("aipp", "template", 5, "got 5"),
    ("aipp", "input_channel_order", "XYZ", "got 'XYZ'"),
    ("aipp", "tolerance", 0, "got 0"),
    ("aipp", "verify_images", 0, "got 0"),
    ("build", "output_dir", 5, "got 5"),
    ("build", "soc_version", "Kirin990", "got 'Kirin990'"),
    ("build", "precision_mode", "int4", "got 'int4'"),
    ("build", "atc_timeout_s", 0, "got 0"),
    ("build", "atc_model", "int4", "got 'int4'"),
    ("build", "atc_model", "int8sim", "no longer built"),
    ("build", "atc_args", ["--bogus"], "unknown atc option --bogus"),
    ("build", "atc_args", "--log=info", "got '--log=info'"),
    ("build", "require_om", "yes please", "got 'yes please'"),
    ("engine", "workers", 0, "got 0"),
    ("engine", "ray_address", 5, "got 5"),
    ("quantization", "skip", "Conv2D", "got 'Conv2D'"),
    ("quantization", "methods", {"Conv2D": "average"}, "got 'average'"),
    ("quantization", "methods", ["mse"], "must be a table"),
    ("quantization", "bias_correction", "yes please", "got 'yes please'"),
    ("quantization", "fallback", "on", "got 'on'"),
    ("quantization", "max_fallback", -1, "got -1"),
    ("quantization", "sensitivity_images", 0, "got 0"),
    ("train", "entry", "train", "got 'train'"),
    ("train", "epochs", 0, "got 0"),
    ("train", "steps", 0, "got 0"),
    ("train", "seed", -3, "got -3"),
    ("train", "min_accuracy", 2, "got 2"),
]


@pytest.mark.parametrize("section,key,value,text", BAD_VALUES,
                         ids=[f"{s}.{k}={v!r}" for s, k, v, _ in BAD_VALUES])
def test_every_field_names_itself_and_the_bad_value_only(section, key, value, text):
    d = demo_dict()
    d.setdefault(section, {})[key] = value
    with pytest.raises(ConfigError) as e:
        config_from_dict(d, source="my.toml")
    lines = str(e.value).splitlines()
    assert lines[0] == "invalid configuration in my.toml:"
    assert any(ln.startswith(f"  {section}.{key}") and text in ln for ln in lines[1:]), str(e.value)
    # the value as written, not the section or the whole configuration around it
    assert "'model': {" not in str(e.value) and "'entry': 'quantflow.demo.net:build'" not in str(e.value)
    assert all(len(ln) < 240 for ln in lines), str(e.value)


@pytest.mark.parametrize("edit,text", [
    (lambda d: d["model"].pop("checkpoint"), "  model.checkpoint is required with model.entry"),
    (lambda d: d["model"].update(mindir="n.mindir"), "  model: give one network"),
    (lambda d: d["normalization"].update(channel_order="GRAY"), "  normalization.channel_order GRAY needs exactly one"),
    (lambda d: d["model"].update(input_shape=[1, 1, 32, 32]), "  model.input_shape [1, 1, 32, 32] has 1 channel(s)"),
    (lambda d: d["aipp"].update(input_channel_order="GRAY"), "  aipp.input_channel_order = 'GRAY' does not fit"),
    (lambda d: d["calibration"].update(per_class_min=30), "  calibration.count = 200 cannot hold"),
    (lambda d: d["evaluation"].pop("threshold"), "  evaluation.threshold is required"),
    (lambda d: d["build"].update(atc_args=["--output=x"]), "  build.atc_args: --output is set by quantflow"),
    (lambda d: d.update(model=5), "  model: must be a table ([model] or { key = value, ... }) (got 5)"),
    (lambda d: d.update(extra={"a": 1}), "  extra: unknown key"),
    (lambda d: d["calibration"].update(methd="kl"), "  calibration.methd: unknown key (did you mean 'method'?)"),
    (lambda d: d.update(trian={}), "  trian: unknown key (did you mean 'train'?)"),
])
def test_checks_across_fields_name_the_fields_not_the_section(edit, text):
    d = demo_dict()
    edit(d)
    with pytest.raises(ConfigError) as e:
        config_from_dict(d, source="my.toml")
    assert text in str(e.value), str(e.value)
    assert "{'" not in str(e.value), str(e.value)


def test_unreadable_configuration_files(tmp_path):
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    with pytest.raises(ConfigError, match="binary.toml is not a text .UTF-8. file"):
        load_config(binary)
    (tmp_path / "folder.toml").mkdir()
    with pytest.raises(ConfigError, match="folder.toml is a folder"):
        load_config(tmp_path / "folder.toml")
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="model: required but missing"):
        load_config(empty)
    rooted = tmp_path / "rooted.toml"
    rooted.write_text((REPO / "quantflow.toml").read_text() + '\nroot = "/"\n')
    with pytest.raises(ConfigError, match="root: unknown key"):
        load_config(rooted)


def test_quantflow_build_exits_2_on_a_bad_configuration_naming_file_and_field(tmp_path, capsys):
    from quantflow.cli.main import main

    d = (REPO / "quantflow.toml").read_text().replace("count = 200", "count = -3")
    (tmp_path / "bad.toml").write_text(d)
    assert main(["build", str(tmp_path / "bad.toml")]) == 2
    err = capsys.readouterr().err
    assert f"quantflow: invalid configuration in {tmp_path / 'bad.toml'}:" in err
    assert "  calibration.count: Input should be greater than 0 (got -3)" in err and "Traceback" not in err
