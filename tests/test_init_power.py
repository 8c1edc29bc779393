"""``quantflow init`` states, in the config it writes, whether the held-out folder can decide the gate
(quantflow.evaluation.power, as preflight says it at each build)."""
from __future__ import annotations

import cv2
import numpy as np
from support.project import tiny_onnx

from quantflow.cli.main import main
from quantflow.config import load_config
from quantflow.evaluation.power import drop_needed


def folders(root, per_class: int) -> None:
    for i in range(2 * per_class):
        (root / str(i % 2)).mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(root / str(i % 2) / f"f{i}.png"), np.full((8, 8, 3), i, np.uint8))


def test_init_writes_the_images_the_gate_needs_into_the_config(tmp_path):
    tiny_onnx(tmp_path / "net.onnx", classes=2, size=8)
    folders(tmp_path / "calib", 10)
    folders(tmp_path / "eval", 20)
    out = tmp_path / "quantflow.toml"
    assert main(["init", "--onnx", str(tmp_path / "net.onnx"), "--calib", str(tmp_path / "calib"),
                 "--eval", str(tmp_path / "eval"), "-o", str(out)]) == 0
    text = out.read_text()
    cfg = load_config(out)   # the comment leaves the config as it was
    assert cfg.evaluation.threshold == 0.01
    said = text.split("# The gate's power on these held-out images")[1].split("\n[")[0]
    # 40 held-out images against a 1-point limit: no image may be lost, and too few to decide it
    assert "judged on 40 image(s)" in said and f"a PASS needs about {drop_needed(0.01, 0.95)}" in said
    assert "INT8 may lose no image net" in said and "WARNING" in said


def test_init_without_a_readable_evaluation_folder_says_nothing_of_it(tmp_path):
    tiny_onnx(tmp_path / "net.onnx", classes=2, size=8)
    out = tmp_path / "quantflow.toml"
    assert main(["init", "--onnx", str(tmp_path / "net.onnx"), "--eval", str(tmp_path / "missing"),
                 "-o", str(out)]) == 0
    assert "The gate's power" not in out.read_text() and load_config(out).evaluation.threshold == 0.01
