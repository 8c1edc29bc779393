"""The demos' trained checkpoints ship in the repository (quantflow/demo/checkpoints/), each with the training
record that says which checkpoint it is: so that every build and every figure starts from the same weights on any
machine (MindSpore's CPU training differs by processor), and the default build trains nothing.

And the train stage's record itself: written beside the checkpoint, it keeps the stage up to date exactly while
the training inputs and the checkpoint are what it records.
"""
from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path

import pytest

from quantflow.config import config_from_dict, load_config
from quantflow.errors import QuantflowError
from quantflow.io.digest import file_sha256
from quantflow.pipeline.build import Build
from quantflow.tasks import train as train_stage

REPO = Path(__file__).resolve().parents[1]
DEMOS = ["quantflow.toml", "examples/mobilenet_v2/quantflow.toml", "examples/mobilenet_v1_imbalanced/quantflow.toml",
         "examples/mobilenet_v3_small/quantflow.toml"]


@pytest.mark.parametrize("config", DEMOS)
def test_each_demo_starts_from_its_shipped_checkpoint_and_trains_nothing(config):
    cfg = load_config(REPO / config)
    ckpt = cfg.path(cfg.model.checkpoint).resolve()
    assert ckpt.parent == REPO / "quantflow" / "demo" / "checkpoints" and ckpt.is_file()
    record = json.loads(train_stage.record_path(cfg).read_text())
    assert record["checkpoint_sha256"] == file_sha256(ckpt)
    # what trained it is what the configuration and the sources say now: the train stage is up to date (if this
    # fails, a demo's network, its training or its [train] settings changed: retrain it with `doit -a train`,
    # commit the checkpoint and its record, and re-measure the figures of README.md and docs/getting-started.md)
    assert train_stage.recorded(cfg) == record, json.dumps(train_stage.training_inputs(cfg), indent=1)
    assert train_stage.STAGE.status(Build(cfg))[0] == "up to date"
    assert 0.5 < record["metrics"]["heldout_top1"] <= 1.0 and record["trained_on"]["mindspore"]


@pytest.mark.parametrize("config", DEMOS)
def test_each_shipped_checkpoint_loads_into_its_network(config):
    import mindspore as ms
    import numpy as np

    from quantflow.data.images import load_images, scan_class_folders
    from quantflow.demo.data import preprocess_batch
    from quantflow.frontends.network import build_network

    cfg = load_config(REPO / config)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = build_network(cfg)  # every parameter of the checkpoint fits the network, none is missing
    items = scan_class_folders(cfg.path(cfg.evaluation.data_dir), cfg.model.num_classes)[::36]
    x = preprocess_batch(load_images([i.path for i in items], 3, 32, 32))
    logits = net(ms.Tensor(x)).asnumpy()
    assert logits.shape == (len(items), 10) and np.isfinite(logits).all()
    # a trained network: it gets most of these held-out images right (every 36th: about one of each class)
    assert (logits.argmax(1) == np.array([i.label for i in items])).mean() >= 0.8


def test_the_checkpoints_are_package_data():
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = sorted(p.relative_to(REPO / "quantflow" / "demo").as_posix()
                     for p in (REPO / "quantflow" / "demo" / "checkpoints").iterdir())
    assert shipped and all(any(fnmatch.fnmatch(f, pat) for pat in patterns["quantflow.demo"]) for f in shipped)
    # one record per checkpoint and nothing else
    stems = {Path(f).name.split(".")[0] for f in shipped}
    assert sorted(shipped) == sorted([f"checkpoints/{s}.ckpt" for s in stems]
                                     + [f"checkpoints/{s}.train.json" for s in stems])


# ----------------------------------------------------------------------------- the train stage's record

def fake_train(cfg, checkpoint_path):
    """A train.entry that writes its settings as the 'checkpoint'."""
    Path(checkpoint_path).write_text(json.dumps(cfg.train.model_dump(mode="json")))
    return {"heldout_top1": 0.5}


def lazy_train(cfg, checkpoint_path):
    return {}


def _cfg(tmp_path, **train):
    d = tomllib.loads((REPO / "quantflow.toml").read_text())
    d["model"]["checkpoint"] = "out/net.ckpt"
    d["train"] = {"entry": "test_demo_checkpoints:fake_train", **train}
    return config_from_dict(d, root=tmp_path)


def test_the_record_beside_the_checkpoint_keeps_training_up_to_date_while_it_holds(tmp_path):
    cfg = _cfg(tmp_path, epochs=2)
    b = Build(cfg)
    assert train_stage.recorded(cfg) is None and not train_stage.STAGE.uptodate(b)
    train_stage.STAGE.run(b)
    ckpt = tmp_path / "out" / "net.ckpt"
    record = json.loads((tmp_path / "out" / "net.train.json").read_text())
    assert record["checkpoint_sha256"] == file_sha256(ckpt) and record["metrics"] == {"heldout_top1": 0.5}
    assert record["inputs"]["train"] == {"entry": "test_demo_checkpoints:fake_train", "epochs": 2}
    assert record["inputs"]["sources"]["test_demo_checkpoints:fake_train"] == [file_sha256(Path(__file__))]
    assert train_stage.STAGE.uptodate(b)
    # a setting left at its default is not part of the record: spelling it out changes nothing
    assert train_stage.recorded(_cfg(tmp_path, epochs=2, seed=0)) == record
    # another setting, or another checkpoint, is another training
    assert train_stage.recorded(_cfg(tmp_path, epochs=3)) is None
    ckpt.write_text("edited")
    assert train_stage.recorded(cfg) is None


def test_a_train_entry_that_writes_no_checkpoint_fails_even_over_an_old_one(tmp_path):
    cfg = _cfg(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "net.ckpt").write_text("an older checkpoint")
    lazy = cfg.model_copy(update={"train": cfg.train.model_copy(update={"entry": "test_demo_checkpoints:lazy_train"})})
    with pytest.raises(QuantflowError, match="returned without writing model.checkpoint"):
        train_stage.STAGE.run(Build(lazy))
    assert not (tmp_path / "out" / "net.train.json").exists()
