"""The range-method comparison command runs (its figures are reported in docs/range-methods.md, not asserted)."""
import math

from benchmarks import methods


def test_zoo_comparison_reports_every_method(tmp_path):
    row = methods.evaluate_zoo("resnet18", tmp_path)
    for m in methods.QF_METHODS:
        sqnr, agreement = row[m]
        assert math.isfinite(sqnr) and sqnr > 10 and 0.0 <= agreement <= 1.0, m
    table = methods.format_zoo([row])
    assert table.splitlines()[2].startswith("| resnet18 |") and "mean SQNR" in table


def test_demo_table_format():
    row = {"demo": "x", "eval": "10", "fp32": 0.9, **{f"qf {m}": 0.8 for m in methods.QF_METHODS},
           **{f"ort {m}": 0.85 for m in methods.ORT_METHODS}}
    line = methods.format_table([row]).splitlines()[2]
    assert line.startswith("| x | 10 | 90.00 |") and "80.00 (-10.00)" in line and "85.00 (-5.00)" in line
