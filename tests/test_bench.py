"""The benchmark runs end to end on a small configuration; its figures are reported, never asserted as speeds."""
import json
import sys

import pytest

from benchmarks import bench, measure


def test_measure_times_a_process_and_cuts_doit_output_into_tasks(tmp_path):
    script = ("import time\nprint('startup')\nprint('.  one', flush=True)\ntime.sleep(0.3)\nx = bytearray(64 << 20)\n"
              "print('-- two', flush=True)\ntime.sleep(0.3)\n")
    run = measure.measure([sys.executable, "-c", script], cwd=tmp_path, interval=0.02)
    assert run.returncode == 0 and [t for _, t in run.lines] == ["startup", ".  one", "-- two"]
    assert run.wall_s >= 0.6 and run.max_rss_mb >= 64 and run.tree_rss_mb >= 64
    st = measure.stages(run)
    assert list(st) == ["startup", "one", "two"]
    assert st["one"]["s"] >= 0.3 and st["two"]["s"] >= 0.3
    assert abs(sum(v["s"] for v in st.values()) - run.wall_s) < 1e-6
    assert st["two"]["rss_mb"] >= 64


def test_measure_counts_the_child_not_the_parent_and_catches_a_short_peak(tmp_path):
    import numpy as np

    parent = np.ones(256 << 17)   # 256 MB resident here, in the measuring process
    small = measure.measure([sys.executable, "-c", "pass"], cwd=tmp_path)
    assert small.max_rss_mb < 128, small.max_rss_mb   # os.wait4's ru_maxrss would count the parent's 256 MB
    peak = measure.measure([sys.executable, "-c", "import time; a = bytearray(200 << 20); del a; time.sleep(0.5)"],
                           cwd=tmp_path, interval=0.2)   # the 200 MB live for far less than the sampling interval
    assert peak.max_rss_mb >= 200 and parent.sum() > 0


@pytest.mark.slow
def test_benchmark_builds_both_sides_and_reports_every_figure(tmp_path):
    row = bench.bench_model("digits", tmp_path, calib=12, evals=20, repeat=1, log=lambda _: None)
    assert row["calib_images"] == 12 and row["eval_images"] == 20 and row["gate"]["passed"]
    (qf,) = row["quantflow"]
    assert qf["wall_s"] > 0 and qf["cpu_s"] > 0 and qf["peak_mb"] > 0
    assert {"preflight", "sample", "graph", "calibrate", "gate", "summary"} <= set(qf["stages"])
    for method in bench.ORT_METHODS:
        (o,) = row["ort"][method]
        assert o["method"] == method and o["images"] == 20 and o["wall_s"] > 0 and o["peak_mb"] > 0
        assert {"calib", "prepare", "quantize", "evaluate"} <= set(o["phases"])
        assert 0 <= o["fp32_top1"] <= 1 and -1 <= o["least_cosine"] <= 1
        assert (tmp_path / f"digits.{method}.onnx").is_file()   # onnxruntime's own INT8 QDQ model
    table = bench.format_table([row])
    assert table.splitlines()[2].startswith("digits") and "x (" in table
    stages = bench.format_stages([row])   # the stages of 0.05 s or more: the gate renders its report
    assert "digits (32x32) quantflow: " in stages and " gate " in stages
    json.dumps(row)   # --json writes it


def test_a_rerun_replaces_its_own_builds_rows_and_keeps_the_others(tmp_path):
    from benchmarks.rows import Rows, chosen

    path = tmp_path / "rows.json"
    first = Rows(path, ("case", "method", "seed"))
    first.put({"case": "a", "method": "default", "seed": 0, "value": 1})
    first.put({"case": "b", "method": "default", "value": 2})            # a row from before seeds were recorded
    again = Rows(path, ("case", "method", "seed"))
    again.put({"case": "b", "method": "default", "seed": 0, "value": 3})
    again.put({"case": "a", "method": "default", "seed": 1, "value": 4})   # another draw: a row of its own
    assert [(r["case"], r.get("seed"), r["value"]) for r in json.loads(path.read_text())] == [
        ("a", 0, 1), ("b", 0, 3), ("a", 1, 4)]
    assert chosen("a,,b", {"a": 1, "b": 2}, "--models") == ["a", "b"]
    with pytest.raises(SystemExit, match="--models: unknown c; known: a, b"):
        chosen("a,c", {"a": 1, "b": 2}, "--models")
