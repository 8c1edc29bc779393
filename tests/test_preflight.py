"""Preflight: a wrong network, shape, class count, image or normalization fails in seconds, by name."""
from __future__ import annotations

import shutil

import cv2
import numpy as np
import pytest
from quantflow.tasks.preflight import preflight
from support import nets

from quantflow.config import config_from_dict
from quantflow.errors import ConfigError, DataError, QuantflowError


def variant(cfg, **sections):
    d = cfg.model_dump(mode="json")
    for section, values in sections.items():
        d[section] = None if values is None else {**(d.get(section) or {}), **values}
    return config_from_dict(d, root=cfg.root)


def test_the_shipped_demo_passes(demo_cfg):
    r = preflight(demo_cfg)
    assert r["network_output"] == [1, 10] and r["aipp_images"] == 4


def test_input_shape_the_network_cannot_take(demo_cfg):
    with pytest.raises(ConfigError, match=r"model.input_shape \[1, 3, 48, 48\]: quantflow.demo.net:build cannot run"):
        preflight(variant(demo_cfg, model={"input_shape": [1, 3, 48, 48]}))


def test_num_classes_against_the_checkpoint_names_the_parameters(demo_cfg):
    with pytest.raises(QuantflowError, match=r"fc2.weight: checkpoint \(10, 64\), network \(12, 64\)"):
        # without [train] the checkpoint is loaded as given
        preflight(variant(demo_cfg, model={"num_classes": 12}, calibration={"per_class_min": 0}, train=None))


def test_num_classes_against_the_network_output(demo_cfg, tmp_path):
    from quantflow.backends.export import export_mindir
    from quantflow.demo.net import build

    mindir = export_mindir(build(10), (1, 3, 32, 32), tmp_path / "net.mindir")
    cfg = variant(demo_cfg, model={"entry": None, "checkpoint": None, "mindir": str(mindir), "num_classes": 9},
                  calibration={"per_class_min": 0}, train=None)
    with pytest.raises(ConfigError, match=r"model.num_classes = 9, but the network's output has shape \[1, 10\]"):
        preflight(cfg)
    with pytest.raises(ConfigError, match=r"takes input \[1, 3, 32, 32\]"):
        preflight(variant(cfg, model={"num_classes": 10, "input_shape": [1, 3, 16, 16]}))


def test_a_detector_is_refused_with_its_heads(demo_cfg, tmp_path):
    from quantflow.backends.export import export_mindir

    mindir = export_mindir(nets.randomize(nets.DetectorStyle()), (1, 3, 32, 32), tmp_path / "det.mindir")
    cfg = variant(demo_cfg, model={"entry": None, "checkpoint": None, "mindir": str(mindir)},
                  calibration={"per_class_min": 0}, train=None)
    with pytest.raises(ConfigError, match=r"outputs have shapes \[1, 27, 4, 4\], \[1, 27, 8, 8\]: the accuracy gate "
                                          r"ranks top-1 classes on the first output"):
        preflight(cfg)


def test_a_wrong_sized_evaluation_image_is_named(demo_cfg, tmp_path):
    shutil.copytree(demo_cfg.path(demo_cfg.evaluation.data_dir), tmp_path / "eval")
    first = sorted((tmp_path / "eval" / "0").iterdir())[0]
    cv2.imwrite(str(first), np.zeros((48, 48, 3), np.uint8))
    with pytest.raises(DataError, match=rf"evaluation.data_dir: wrong size 48x48 \(expected 32x32\): .*{first.name}"):
        preflight(variant(demo_cfg, evaluation={"data_dir": str(tmp_path / "eval")}))
