"""Property tests: whatever a user writes, the config loader and the AIPP parser either accept it or
raise quantflow's own error with a message, never another exception."""
from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quantflow.backends import aipp
from quantflow.config import config_from_dict, load_config
from quantflow.engine.aipp import apply
from quantflow.errors import QuantflowError

REPO = Path(__file__).resolve().parents[1]
DEMO = tomllib.loads((REPO / "quantflow.toml").read_text())

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10 ** 12, 10 ** 12), st.floats(allow_nan=True),
                    st.text(max_size=20), st.lists(st.floats(-1e3, 1e3), max_size=5),
                    st.lists(st.integers(-5, 100), max_size=5))
keys = st.sampled_from(sorted({k for sec in DEMO.values() if isinstance(sec, dict) for k in sec} | {"bogus"}))
sections = st.sampled_from(sorted(DEMO) + ["bogus"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(sections, keys, scalars), max_size=4), drop=st.lists(sections, max_size=2))
def test_any_edit_of_the_config_loads_or_raises_a_config_error(edits, drop):
    d = {k: dict(v) if isinstance(v, dict) else v for k, v in DEMO.items()}
    for section in drop:
        d.pop(section, None)
    for section, key, value in edits:
        if isinstance(d.get(section), dict) or section not in d:
            d.setdefault(section, {})[key] = value
    try:
        cfg = config_from_dict(d, root="/r")
    except QuantflowError as err:
        assert str(err).startswith("invalid configuration in") and "\n  " in str(err)
    else:
        assert cfg.model.num_classes > 1


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300))
def test_any_toml_text_loads_or_raises_a_config_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cfg") / "quantflow.toml"
    path.write_text(text, encoding="utf-8")
    try:
        load_config(path)
    except QuantflowError as err:
        assert str(path) in str(err)


aipp_keys = st.sampled_from(["aipp_mode", "input_format", "src_image_size_w", "src_image_size_h", "csc_switch",
                             "rbuv_swap_switch", "mean_chn_0", "mean_chn_1", "mean_chn_2", "min_chn_0",
                             "var_reci_chn_0", "var_reci_chn_1", "crop", "related_input_rank"])
aipp_values = st.one_of(st.sampled_from(["static", "dynamic", "RGB888_U8", "YUV400_U8", "true", "false", "32",
                                         "0.5", "-1", "1e9", "nan", "inf"]), st.text(max_size=8))


@settings(max_examples=300, deadline=None)
@given(pairs=st.lists(st.tuples(aipp_keys, aipp_values), max_size=10), braces=st.sampled_from(["ok", "open", "close",
                                                                                                  "nested", "none"]),
       noise=st.text(max_size=40))
def test_any_aipp_config_parses_and_applies_or_raises_an_aipp_error(pairs, braces, noise):
    body = "\n".join(f"    {k} : {v}" for k, v in pairs)
    text = {"ok": f"aipp_op {{\n{body}\n}}\n", "open": f"aipp_op {{\n{body}\n", "close": f"{body}\n}}\n",
            "nested": f"aipp_op {{\naipp_op {{\n{body}\n}}\n}}\n", "none": body}[braces] + noise
    frame = np.full((32, 32, 3), 128, np.uint8)
    try:
        out = apply(aipp.parse(text), frame)
    except QuantflowError as err:
        assert str(err)
    else:
        assert out.shape[1:] == (32, 32) and out.dtype == np.float32
