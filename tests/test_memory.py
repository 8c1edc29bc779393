"""Memory is bounded by the batch, not the data set: calibration and the gate over 4x the images
allocate (tracemalloc: Python and NumPy memory) about what they allocate over 1x.

An implementation holding every image (uint8 + preprocessed float32, ~15 KB each at 3x32x32) would
add ~3 x 15 KB per original image, several times the whole 1x peak on these sets."""
from __future__ import annotations

import json
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
from quantflow.tasks.inputs import evaluation_set, image_batches

from quantflow.backends.aipp import parse
from quantflow.evaluation.metrics import metric
from quantflow.frontends.mindir import read_mindir
from quantflow.quantization.calibrater import calibrate
from quantflow.quantization.passes import fold_for_quantization
from quantflow.quantization.qparams import QuantParams

TIMES = 4


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _replicated(src: Path, dst: Path, times: int) -> Path:
    """``src``'s class folders with every image copied ``times`` times."""
    for cls in sorted(p for p in src.iterdir() if p.is_dir()):
        (dst / cls.name).mkdir(parents=True)
        for img in sorted(cls.iterdir()):
            for k in range(times):
                shutil.copyfile(img, dst / cls.name / f"{k}_{img.name}")
    return dst


def _artifacts(project: Path) -> dict[str, Path]:
    return {k: Path(v) for k, v in json.loads((project / "build" / "latest.json").read_text())["artifacts"].items()}


IMAGE_BYTES = 3 * 32 * 32 * (1 + 4)   # a demo image as uint8 and as float32


def _calibration_peaks(built_demo, demo_cfg, times) -> dict:
    """Peak memory of calibrating (KL) the demo on its 128 first held-out images repeated n times, per n."""
    folded = fold_for_quantization(read_mindir(_artifacts(built_demo[0])["graph"] / "model.mindir"))
    paths = sorted(demo_cfg.path(demo_cfg.evaluation.data_dir).rglob("*.png"))[:128]
    assert len(paths) == 128
    return {n: _peak(lambda: calibrate(folded, image_batches(demo_cfg, paths * n, 32), "kl")) for n in times}


def test_calibration_memory_does_not_grow_with_the_images(built_demo, demo_cfg, monkeypatch):
    """Beyond what the range pass keeps for the histogram pass (at most ``calibrater.KEPT_BYTES``, here set below
    one batch's activations, so that nothing is kept)."""
    from quantflow.quantization import calibrater

    monkeypatch.setattr(calibrater, "KEPT_BYTES", 64 * 1024)
    peaks = _calibration_peaks(built_demo, demo_cfg, (1, TIMES))
    assert peaks[TIMES] - peaks[1] < 0.1 * (TIMES - 1) * 128 * IMAGE_BYTES, peaks


def test_calibration_keeps_the_range_pass_activations_only_up_to_its_bound(built_demo, demo_cfg, monkeypatch):
    """The histogram pass reads the range pass's activations where they fit in ``calibrater.KEPT_BYTES``: memory
    then grows with the images up to that bound and no further."""
    from quantflow.quantization import calibrater

    bound = 2 * 2 ** 20
    monkeypatch.setattr(calibrater, "KEPT_BYTES", bound)
    peaks = _calibration_peaks(built_demo, demo_cfg, (1, TIMES, 2 * TIMES))
    assert peaks[2 * TIMES] - peaks[1] < bound + 0.1 * (2 * TIMES - 1) * 128 * IMAGE_BYTES, peaks


def test_gate_memory_does_not_grow_with_the_images(built_demo, demo_cfg, tmp_path):
    dirs = _artifacts(built_demo[0])
    graph = read_mindir(dirs["graph"] / "model.mindir")
    folded = fold_for_quantization(graph)
    qp = QuantParams.load(dirs["fallback"])
    aipp = parse((dirs["aipp"] / "aipp.cfg").read_text())
    src = demo_cfg.path(demo_cfg.evaluation.data_dir)
    n_images = len(list(src.rglob("*.png")))
    peaks, reports = {}, {}
    for n in (1, TIMES):
        folder = _replicated(src, tmp_path / f"x{n}", n)
        cfg = demo_cfg.model_copy(update={"evaluation": demo_cfg.evaluation.model_copy(update={"data_dir": folder})})
        peaks[n] = _peak(lambda: reports.__setitem__(n, metric("top1").evaluate(evaluation_set(cfg), cfg.evaluation, graph,
                                                                                  folded, qp, aipp)))
    assert reports[TIMES]["images"] == TIMES * reports[1]["images"] == TIMES * n_images
    assert np.isclose(reports[TIMES]["int8_top1"], reports[1]["int8_top1"])
    image_bytes = 3 * 32 * 32 * (1 + 4 + 2)  # uint8, preprocessed float32, AIPP float16
    assert peaks[TIMES] - peaks[1] < 0.1 * (TIMES - 1) * n_images * image_bytes, peaks
