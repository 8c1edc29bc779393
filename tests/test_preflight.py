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


def test_it_states_the_images_the_gate_needs(demo_cfg, tmp_path):
    from quantflow.evaluation.power import drop_needed, max_net_lost
    from quantflow.tasks.fallback import tuning_and_gate_sets
    from quantflow.tasks.preflight import gate_power

    p = preflight(demo_cfg)["power"]
    (top1,) = p["reaches"]
    # the demo gates on every held-out image (no fallback): 1 point on 359 images
    assert p["gate_images"] == p["folder_images"] == top1["images"] and p["tuning_images"] == 0
    assert top1["needed"] == drop_needed(0.01, 0.95) and top1["max_net_lost"] == max_net_lost(top1["images"], 0.01,
                                                                                               0.95)
    assert top1["reachable"] == (top1["images"] >= top1["needed"])
    # with the automatic fallback: estimated on the images the gate judges beside the tuning images
    auto_cfg = variant(demo_cfg, quantization={"fallback": "auto"})
    auto = gate_power(auto_cfg)
    tune, judge, _ = tuning_and_gate_sets(auto_cfg)
    (gated,) = auto["reaches"]
    assert gated["images"] == auto["gate_images"] == len(judge) and auto["tuning_images"] == len(tune)
    assert auto["folder_images"] == p["folder_images"] and gated["max_net_lost"] <= top1["max_net_lost"]
    # before the sample has run, which calibration images it leaves to tune on is not known: said so, no count
    from quantflow.tasks.preflight import _tuning_said
    from quantflow.tasks.sample import manifest_path
    fresh = variant(auto_cfg, build={"output_dir": str(tmp_path / "fresh")})
    assert not manifest_path(fresh).is_file()
    assert _tuning_said(fresh, auto) == (f"the images of calibration.data_dir {fresh.calibration.data_dir} the "
                                         f"calibration sample (calibration.count {fresh.calibration.count}) leaves "
                                         f"out, topped up from the sample to 64 where fewer")
    manifest_path(fresh).parent.mkdir(parents=True)
    manifest_path(fresh).write_text("{}")
    assert _tuning_said(fresh, auto).startswith(f"{auto['tuning_images']} others (")
    # a limit the images cannot decide is a WARNING, not a failure; a wide one is not
    tight = gate_power(variant(demo_cfg, evaluation={"threshold": 0.002}))
    assert tight["reaches"][0]["reachable"] is False and "WARNING" in tight["lines"][0]
    wide = gate_power(variant(demo_cfg, evaluation={"threshold": 0.05}))
    assert wide["reaches"][0]["reachable"] and "WARNING" not in wide["lines"][0]


def test_a_class_limit_is_judged_on_the_smallest_class(demo_cfg):
    from quantflow.tasks.preflight import gate_power

    p = gate_power(variant(demo_cfg, evaluation={"max_class_drop": 0.05}))
    drop, per_class = p["reaches"]
    assert per_class["limit"] == 0.05 and per_class["images"] < drop["images"] / 5
