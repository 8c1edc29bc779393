"""The Ascend host's side of ``quantflow verify`` and ``quantflow dump``, for tests: the stand-in offline model
(``ais_bench_standin``: a JSON file naming a deploy.onnx and the aipp.cfg it would have been built with) and the
check of a dump against the deploy interpreter fed through the independent AIPP (``aipp_reference``).  Nothing here
imports quantflow."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from . import aipp_reference as doc
from . import deploy_interpreter

STANDIN = Path(__file__).parent / "ais_bench_standin"
# msaccucmp's golden-file pattern (CANN 8.1 tools/operator_cmp/compare/cmp_utils/reg_manager.py)
NUMPY_DUMP_PATTERN = re.compile(r"^([\.A-Za-z0-9_-]+\.[0-9]+)\.[0-9]{1,255}\.npy$")


def forget_ais_bench(monkeypatch) -> None:
    """Drop, for the rest of the test, any ``ais_bench`` module an earlier test imported."""
    for name in [m for m in sys.modules if m == "ais_bench" or m.startswith("ais_bench.")]:
        monkeypatch.delitem(sys.modules, name)


def use_standin(monkeypatch) -> None:
    """Make ``ais_bench`` the stand-in for the rest of the test."""
    monkeypatch.syspath_prepend(str(STANDIN))
    forget_ais_bench(monkeypatch)


def standin_om(folder: Path, build: dict, aipp_cfg: Path | None = None) -> Path:
    """The stand-in's "offline model": the build's deploy.onnx and the AIPP config it was "converted" with."""
    om = folder / "model.om"
    om.write_text(json.dumps({"deploy_onnx": build["deploy_onnx"], "aipp_cfg": str(aipp_cfg or build["aipp_config"])}))
    return om


def all_node_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every node output a graph output (the deploy interpreter returns the graph outputs)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    m.graph.output.extend(helper.make_empty_tensor_value_info(o) for n in model.graph.node for o in n.output if o)
    return m


def check_dump(out: Path, build: dict) -> int:
    """Every golden file is named as msaccucmp reads golden data and holds what the deploy interpreter computes for
    that node output, from the dumped device inputs (the frames through the independent AIPP, the other inputs as
    written); returns the files checked."""
    listing = json.loads((out / "dump.json").read_text())
    model = onnx.load(build["deploy_onnx"])
    inputs = listing["device_inputs"]
    assert [d["input"] for d in inputs] == [i.name for i in model.graph.input]
    cfg = doc.read_config(Path(build["aipp_config"]).read_text())
    batch = model.graph.input[0].type.tensor_type.shape.dim[0].dim_value
    raw = np.fromfile(out / inputs[0]["file"], np.uint8).reshape(batch, -1)
    assert raw.shape[1] == doc.frame_bytes(cfg)
    x16 = np.stack([doc.aipp(cfg, f) for f in raw])
    np.testing.assert_array_equal(np.load(out / "input" / "aipp_output.npy"), x16)
    others = {d["input"]: np.fromfile(out / d["file"], np.dtype(d["dtype"])).reshape(d["shape"]) for d in inputs[1:]}
    full = all_node_outputs(model)
    values = dict(zip((o.name for o in full.graph.output), deploy_interpreter.run(full, x16, others)))
    nodes = {n.name: n for n in model.graph.node}
    files = sorted(p.name for p in (out / "golden").iterdir())
    assert files == sorted(Path(g["file"]).name for g in listing["golden"])
    for g in listing["golden"]:
        name = Path(g["file"]).name
        m = NUMPY_DUMP_PATTERN.match(name)
        assert m and m.group(1) == f"{re.sub(r'[^A-Za-z0-9_-]', '_', g['node'])}.{g['output_index']}"
        assert name.endswith(f".{listing['timestamp']}.npy")
        node = nodes[g["node"]]
        want = values[node.output[g["output_index"]]]
        got = np.load(out / g["file"])
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want, err_msg=name)
    dumped = {(g["node"], g["output_index"]) for g in listing["golden"]}
    skipped = {(s["node"], s["output_index"]) for s in listing["not_dumped"]}
    assert dumped | skipped == {(n.name, k) for n in model.graph.node for k, o in enumerate(n.output) if o}
    return len(files)
