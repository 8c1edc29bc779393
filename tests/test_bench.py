"""The benchmark runs end to end (small sizes); its figures are reported, never asserted as speeds."""
from benchmarks import bench


def test_benchmark_runs_and_reports_every_column(tmp_path):
    row = bench.bench_model("digits", images=64, evals=64, workdir=tmp_path)
    for key in ("qf_cal_minmax_s", "qf_cal_kl_s", "ort_cal_s", "qf_int8_ips", "ort_int8_ips", "fp32_ips",
                "qf_cal_mse_s", "sensitivity_s", "cal_gate_s", "peak_rss_mb"):
        assert row[key] > 0, key
    assert (tmp_path / "digits_qdq.onnx").is_file()  # onnxruntime's own INT8 model of the same graph
    table = bench.format_table([row])
    assert table.splitlines()[2].startswith("digits") and "x |" in table
