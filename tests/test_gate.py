import copy
import json
from pathlib import Path

import numpy as np
import pytest

from quantflow.calibrate import load_quant_params
from quantflow.gate import compare, evaluate, format_table
from quantflow.quantize import QLayer


def test_compare_arithmetic():
    labels = np.array([0, 1, 1, 0])
    fp = np.array([[2.0, 0], [0, 2], [0, 2], [2, 0]])
    q = np.array([[2.0, 0], [0, 2], [2, 0], [2, 0]])
    r = compare(fp, q, labels, threshold=0.2)
    assert r["fp32_top1"] == 1.0 and r["int8_top1"] == 0.75 and r["drop"] == 0.25
    assert r["passed"] is False and r["top1_agreement"] == 0.75
    assert r["per_class"]["1"] == {"images": 2, "fp32_top1": 1.0, "int8_top1": 0.5}
    assert compare(fp, q, labels, threshold=0.25)["passed"] is True
    text = format_table(r)
    assert "accuracy gate: FAIL" in text and "drop -25.00 points" not in text and "+25.00 points" in text


def test_demo_passes_and_a_tampered_quantization_fails(built_demo, demo_cfg, demo_net):
    kdir = Path(json.loads((built_demo[0] / "build" / "latest.json").read_text())["artifacts"])
    model = load_quant_params(kdir)
    good = evaluate(demo_cfg, demo_net, model)
    assert good["passed"] and good["top1_agreement"] > 0.97
    # break it: the second layer's weights lose all but their sign
    broken = copy.deepcopy(model)
    layer = [s for s in broken.steps if isinstance(s, QLayer)][1]
    layer.w_q = (np.sign(layer.w_q) * 127).astype(np.int8)
    bad = evaluate(demo_cfg, demo_net, broken)
    assert not bad["passed"]
    assert bad["drop"] > demo_cfg.evaluation.threshold
    assert bad["fp32_top1"] == good["fp32_top1"]
