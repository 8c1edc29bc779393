import tomllib
from pathlib import Path

import mindspore as ms
import pytest

from quantflow.config import config_from_dict
from quantflow.errors import ConfigError, QuantflowError
from quantflow.frontends.network import build_network, load_entry

REPO = Path(__file__).resolve().parents[1]


def cfg_with(tmp_path, **model):
    d = tomllib.loads((REPO / "quantflow.toml").read_text())
    d["model"].update(model)
    return config_from_dict(d, root=tmp_path)


def not_a_cell():
    return object()


def test_entry_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module_xyz'"):
        load_entry("no_such_module_xyz:f", "model.entry")
    with pytest.raises(ConfigError, match="has no attribute 'nothing'"):
        load_entry("quantflow.demo.net:nothing", "model.entry")
    with pytest.raises(ConfigError, match="not a mindspore.nn.Cell"):
        build_network(cfg_with(tmp_path, entry="test_model:not_a_cell"), load_weights=False)


def test_checkpoint_errors(tmp_path):
    with pytest.raises(ConfigError, match="model.checkpoint: file not found"):
        build_network(cfg_with(tmp_path, checkpoint="missing.ckpt"))
    (tmp_path / "garbage.ckpt").write_bytes(b"\x00garbage")
    with pytest.raises(QuantflowError, match="cannot read"):
        build_network(cfg_with(tmp_path, checkpoint="garbage.ckpt"))
    # a checkpoint of another network
    other = ms.nn.Dense(3, 4)
    ms.save_checkpoint(other, str(tmp_path / "other.ckpt"))
    with pytest.raises(QuantflowError, match="does not match the network; missing: features.0.weight"):
        build_network(cfg_with(tmp_path, checkpoint="other.ckpt"))


def test_training_fails_below_min_accuracy_and_stops_at_train_steps(tmp_path, capsys):
    import warnings

    from quantflow.demo.train import train

    d = tomllib.loads((REPO / "quantflow.toml").read_text())
    d["train"].update(epochs=2, steps=5, min_accuracy=0.999)
    cfg = config_from_dict(d, root=REPO)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's "Mean of empty slice" among them
        with pytest.raises(QuantflowError, match="below train.min_accuracy=0.999"):
            train(cfg, tmp_path / "m.ckpt")
    out = capsys.readouterr().out
    # one epoch line, for the epoch train.steps ended in; no loss of an empty epoch (nan)
    assert "epoch 1/2: loss " in out and "over 5 steps (stopped at train.steps = 5)" in out
    assert "epoch 2/2" not in out and "nan" not in out


def _raises(depth):
    return {}[depth]


def test_an_entry_that_raises_names_the_field_the_entry_and_the_line(tmp_path):
    import inspect

    f = load_entry("test_model:_raises", "model.entry")
    assert list(inspect.signature(f).parameters) == ["depth"]  # num_classes detection sees the real signature
    with pytest.raises(ConfigError, match=r"model.entry = 'test_model:_raises' raised KeyError: 3 \(at .*test_model.py, "
                                          r"line \d+\)"):
        f(3)
    with pytest.raises(ConfigError, match=r"raised TypeError: .*missing 1 required positional argument: 'depth'$"):
        f()  # called with what it does not take: no line of quantflow's named
    with pytest.raises(ConfigError, match="model.entry = 'nowhere.mod:build': cannot import module 'nowhere.mod'"):
        load_entry("nowhere.mod:build", "model.entry")
    with pytest.raises(ConfigError, match="'SIZE' is a int, not a callable"):
        load_entry("quantflow.demo.data:SIZE", "model.entry")


def test_module_file_of_an_entry_that_does_not_import_is_empty(tmp_path, monkeypatch):
    from quantflow.entry import module_file

    assert module_file("nowhere.mod:build") == [] and module_file("nowhere:build") == []
    (tmp_path / "qf_bad_pkg").mkdir()
    (tmp_path / "qf_bad_pkg" / "__init__.py").write_text("raise RuntimeError('broken package')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert module_file("qf_bad_pkg.net:build") == []
    assert module_file("quantflow.demo.net:build") == [str(REPO / "quantflow" / "demo" / "net.py")]
