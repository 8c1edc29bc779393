"""Issue 36 part 1: tuning images that cost the gate nothing.  By default the recovery's check and the automatic
fallback tune on calibration images beyond the calibration sample (the sample tops them up only below 64), never on an
image the gate judges, and the gate judges every held-out image; ``evaluation.tune_dir`` and ``tune_from =
"held_out"`` (the held-out folder cut in two) as the user asks; a change of the tuning images reruns what reads
them."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.project import REPO

from quantflow.config import load_config
from quantflow.data.sampling import sample, write_manifest
from quantflow.errors import DataError
from tasks.fallback import evaluation_inputs, tuning_and_gate_sets
from tasks.sample import calibration_paths, manifest_path

CONFIG = """
[model]
entry = "quantflow.demo.net:build"
checkpoint = "{repo}/quantflow/demo/checkpoints/digits.ckpt"
input_shape = [1, 3, 32, 32]
num_classes = 10

[normalization]
mean = [0.471, 0.463, 0.467]
std = [0.257, 0.260, 0.260]
scale = "0-1"
channel_order = "RGB"

[calibration]
data_dir = "calib"
count = {count}
per_class_min = 5

[evaluation]
data_dir = "eval"
threshold = 0.01
{evaluation}

[aipp]
template = "static_rgb888_u8.cfg"
input_channel_order = "BGR"

[quantization]
fallback = "auto"
"""


def _project(tmp_path: Path, evaluation: str = "", count: int = 200, sampled: bool = True):
    if not (tmp_path / "calib").is_dir():
        shutil.copytree(REPO / "calib_data", tmp_path / "calib")
        shutil.copytree(REPO / "eval_data", tmp_path / "eval")
    (tmp_path / "quantflow.toml").write_text(CONFIG.format(repo=REPO, count=count, evaluation=evaluation))
    cfg = load_config(tmp_path / "quantflow.toml")
    if sampled:
        k = cfg.calibration
        write_manifest(sample(cfg.path(k.data_dir), cfg.root, k.count, k.per_class_min, k.seed, 10, 3, 32, 32,
                              "error"), manifest_path(cfg))
    return cfg


def _resolved(paths) -> set:
    return {Path(p).resolve() for p in paths}


def test_by_default_the_fallback_tunes_on_calibration_images_beyond_the_sample_and_the_gate_judges_all(tmp_path):
    cfg = _project(tmp_path, "tune_images = 80")
    tune, judge, source = tuning_and_gate_sets(cfg)
    calibrated = _resolved(calibration_paths(cfg))
    held = sorted((tmp_path / "eval").glob("*/*.png"))
    assert len(judge) == len(held) == 359 and _resolved(judge.paths) == _resolved(held)
    assert len(tune) == 80 and not _resolved(tune.paths) & calibrated
    assert _resolved(tune.paths) <= _resolved((tmp_path / "calib").glob("*/*.png"))
    assert sorted(set(tune.labels.tolist())) == list(range(10))     # every class keeps its share
    assert source.startswith("80 images of calibration.data_dir calib beyond the calibration sample, drawn with "
                             "evaluation.seed 0")
    again, _, _ = tuning_and_gate_sets(cfg)
    assert again.paths == tune.paths                                   # seeded: the same images every time


def test_the_images_the_ranges_were_fitted_on_tune_only_where_too_few_are_beyond_the_sample(tmp_path):
    from tasks.fallback import MIN_TUNING_IMAGES

    cfg = _project(tmp_path)     # 300 calibration images, 200 sampled: 100 beyond; the default wants 359
    tune, judge, source = tuning_and_gate_sets(cfg)
    calibrated = _resolved(calibration_paths(cfg))
    assert len(tune) == 100 and len(judge) == 359 and not _resolved(tune.paths) & calibrated
    assert source.startswith("100 images of calibration.data_dir calib beyond the calibration sample, drawn")
    cfg = _project(tmp_path, count=280)   # 20 beyond: topped up from the sample to MIN_TUNING_IMAGES
    tune, _, source = tuning_and_gate_sets(cfg)
    calibrated = _resolved(calibration_paths(cfg))
    assert len(tune) == MIN_TUNING_IMAGES and not _resolved(tune.paths[:20]) & calibrated
    assert _resolved(tune.paths[20:]) <= calibrated
    assert f"20 images of calibration.data_dir calib beyond the calibration sample and {MIN_TUNING_IMAGES - 20} " \
           f"of the sample itself (the ranges were fitted on those" in source


def test_an_image_the_gate_judges_is_never_a_tuning_image(tmp_path):
    cfg = _project(tmp_path, "tune_images = 300")
    copy = tmp_path / "calib" / "3" / "judged.png"
    shutil.copy2(next((tmp_path / "eval" / "3").glob("*.png")), copy)
    tune, judge, source = tuning_and_gate_sets(cfg)
    assert copy.resolve() not in _resolved(tune.paths) and len(judge) == 359
    assert "1 also in evaluation.data_dir left out" in source


def test_held_out_split_and_tune_dir_on_request(tmp_path):
    cfg = _project(tmp_path, 'tune_from = "held_out"')
    tune, judge, source = tuning_and_gate_sets(cfg)
    assert len(tune) + len(judge) == 359 and not _resolved(tune.paths) & _resolved(judge.paths)
    assert 'evaluation.tune_from = "held_out"' in source
    shutil.copytree(REPO / "calib_data" / "3", tmp_path / "tune" / "3")
    cfg = _project(tmp_path, 'tune_dir = "tune"')
    tune, judge, source = tuning_and_gate_sets(cfg)
    assert len(tune) == 30 and len(judge) == 359 and source == "evaluation.tune_dir tune"
    shutil.copy2(next((tmp_path / "eval" / "3").glob("*.png")), tmp_path / "tune" / "3" / "copy.png")
    with pytest.raises(DataError, match="evaluation.tune_dir tune and evaluation.data_dir eval share 1 image"):
        tuning_and_gate_sets(cfg)


def test_the_tuning_folder_is_part_of_the_key_of_what_reads_it(tmp_path):
    cfg = _project(tmp_path, sampled=False)
    before = evaluation_inputs(cfg)
    assert before["tune_data"] is not None
    shutil.copy2(next((tmp_path / "calib" / "3").glob("*.png")), tmp_path / "calib" / "3" / "more.png")
    assert evaluation_inputs(cfg)["tune_data"] != before["tune_data"]
    # before the sample has run (preflight's estimate) the tuning images are drawn from the whole folder
    tune, judge, source = tuning_and_gate_sets(cfg)
    assert len(tune) == 301 and len(judge) == 359 and "(before sampling)" in source
    held = _project(tmp_path, 'tune_from = "held_out"', sampled=False)
    assert evaluation_inputs(held)["tune_data"] is None


def _fallback_off(cfg_path: Path, evaluation: str = ""):
    text = cfg_path.read_text().replace('fallback = "auto"', 'fallback = "off"')
    cfg_path.write_text(text.replace("threshold = 0.01\n", f"threshold = 0.01\n{evaluation}\n"))
    return load_config(cfg_path)


def test_without_the_fallback_the_recovery_checks_on_images_beyond_the_sample_and_never_tops_them_up(tmp_path):
    """fallback = "off": the recovery's costly methods are still checked on images the ranges were not fitted on
    (those beyond the sample, as init leaves them), only where at least MIN_TUNING_IMAGES are there; never on the
    sample itself, nor on the gate's held-out images."""
    from tasks.fallback import MIN_TUNING_IMAGES, recovery_tuning_set
    from tasks.recover import _checks

    _project(tmp_path)                    # 300 calibration images, 200 sampled: 100 beyond
    cfg = _fallback_off(tmp_path / "quantflow.toml")
    tune = recovery_tuning_set(cfg)
    assert _checks(cfg) and len(tune) == 100 and not _resolved(tune.paths) & _resolved(calibration_paths(cfg))
    _, judge, _ = tuning_and_gate_sets(cfg)
    assert len(judge) == 359 and not _resolved(tune.paths) & _resolved(judge.paths)
    _project(tmp_path, count=300 - MIN_TUNING_IMAGES + 1)      # one image short
    assert recovery_tuning_set(_fallback_off(tmp_path / "quantflow.toml")) is None
    _project(tmp_path)
    cfg = _fallback_off(tmp_path / "quantflow.toml", 'tune_from = "held_out"')   # the gate's images: never cut
    assert not _checks(cfg) and recovery_tuning_set(cfg) is None
