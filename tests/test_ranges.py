import numpy as np
import pytest

from quantflow.quantization.ranges import Observer, kl_threshold, percentile_range


def observe_all(data, bins=2048, chunks=4):
    obs = Observer("t", bins)
    parts = np.array_split(data, chunks)
    for p in parts:
        obs.observe(p)
    obs.start_histograms()
    for p in parts:
        obs.observe(p)
    return obs


def test_minmax_is_exact():
    rng = np.random.default_rng(0)
    x = rng.normal(size=10000)
    assert observe_all(x).range("minmax") == (x.min(), x.max())


def test_percentile_clips_outliers():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-1, 1, 100000), [50.0, -40.0]])
    lo, hi = observe_all(x).range("percentile", 99.0)
    assert hi == pytest.approx(0.99, abs=0.03)
    assert lo == pytest.approx(-0.99, abs=0.03)
    # non-negative data keeps its minimum as the floor (act_qparams then includes 0)
    lo, hi = observe_all(np.abs(x)).range("percentile", 99.0)
    assert lo == np.abs(x).min() and hi == pytest.approx(0.99, abs=0.03)


def test_percentile_range_from_histogram_matches_numpy():
    rng = np.random.default_rng(2)
    x = rng.normal(size=200000)
    hist, _ = np.histogram(x, bins=4096, range=(x.min(), x.max()))
    lo, hi = percentile_range(hist, x.min(), x.max(), 99.9)
    assert lo == pytest.approx(np.percentile(x, 0.1), abs=0.01)
    assert hi == pytest.approx(np.percentile(x, 99.9), abs=0.01)


def test_kl_threshold_ignores_rare_outliers_but_keeps_the_bulk():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(size=200000), rng.uniform(-30, 30, 20)])
    lo, hi = observe_all(x).range("kl")
    assert lo == -hi  # signed data: symmetric threshold
    assert 2.5 < hi < 15.0  # far inside the +-30 outliers, but not clipping the gaussian bulk
    assert hi < np.abs(x).max() / 2


def test_kl_on_relu_output_ignores_the_zero_spike():
    rng = np.random.default_rng(4)
    y = np.maximum(rng.normal(size=300000), 0.0)  # half exact zeros
    lo, hi = observe_all(y).range("kl")
    assert lo == 0.0
    assert hi > 2.5  # without the zero-spike handling the search clips far below the tail


def test_kl_threshold_of_uniform_data_is_the_maximum():
    hist = np.full(2048, 100)
    assert kl_threshold(hist, 4.0, 127) == pytest.approx(4.0, rel=0.01)


def test_observer_rejects_nan_and_needs_the_range_pass():
    obs = Observer("n")
    with pytest.raises(FloatingPointError, match="observer n"):
        obs.observe(np.array([1.0, np.nan]))
    with pytest.raises(RuntimeError, match="saw no data"):
        Observer("e").start_histograms()
    obs2 = Observer("h")
    obs2.observe(np.ones(3))
    with pytest.raises(RuntimeError, match="histogram pass did not run"):
        obs2.range("kl")
