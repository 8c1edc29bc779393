import numpy as np
import pytest

from quantflow.quantization.ranges import (
    Observer,
    abs_quantile,
    kl_threshold,
    mse_range,
    percentile_range,
    quantization_mse,
)
from quantflow.quantization.scheme import QMAX, QMIN, act_qparams


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


# --------------------------------------------------------------------------------------------- mse (IFMR)
IFMR_FACTORS = np.round(np.arange(0.70, 1.30 + 1e-9, 0.01), 2)


def qdq_mse(x, clip_lo, clip_hi):
    """The int8 quantize-dequantize mean squared error of the raw samples ``x`` under the scheme's
    parameters for [clip_lo, clip_hi] (independent of ranges.py)."""
    s, o = act_qparams(clip_lo, clip_hi)
    q = np.clip(np.round(x / s) + o, QMIN, QMAX)
    return float(np.mean(((q - o) * s - x) ** 2))


def ifmr_candidates(p_lo, p_hi, floor=None):
    """The IFMR clips: the percentile range scaled by 0.70 .. 1.30 (a non-negative tensor keeps its floor)."""
    return [(min(p_lo * f, 0.0), p_hi * f) if floor is None else (floor, p_hi * f) for f in IFMR_FACTORS]


def raw_errors(x, cands):
    return np.array([qdq_mse(x, a, b) for a, b in cands])


@pytest.mark.parametrize("dist", ["normal", "laplace", "relu", "skewed"])
def test_mse_range_matches_a_brute_force_search_on_the_raw_samples(dist):
    rng = np.random.default_rng(11)
    n = 200000
    x = {"normal": lambda: rng.normal(size=n), "laplace": lambda: rng.laplace(size=n),
         "relu": lambda: np.maximum(rng.normal(size=n), 0.0),
         "skewed": lambda: rng.gamma(2.0, 1.0, n) - 1.0}[dist]()
    floor = 0.0 if dist == "relu" else None
    obs = observe_all(x)
    lo, hi = obs.range("mse")
    assert (lo, hi) == mse_range(obs.hist_signed, obs.lo, obs.hi)

    # the same candidate clips (from the histogram's 99.9999th percentile range, itself checked against
    # np.percentile above), each scored by the int8 error on the raw samples
    cands = ifmr_candidates(*percentile_range(obs.hist_signed, obs.lo, obs.hi, 99.9999), floor=floor)
    errs = raw_errors(x, cands)
    best = int(np.argmin(errs))
    # the search has a real interior optimum here (both ends of the sweep are worse) ...
    assert 0 < best < len(IFMR_FACTORS) - 1
    assert errs[0] > 1.1 * errs[best] and errs[-1] > 1.1 * errs[best]
    # ... the module returns one of the candidates, and one whose raw error is the least up to the
    # bin-centre approximation
    k = int(np.argmin([abs(c[1] - hi) + abs(c[0] - lo) for c in cands]))
    assert (lo, hi) == pytest.approx(cands[k], rel=1e-9, abs=1e-12)
    assert errs[k] <= 1.005 * errs[best] and abs(k - best) <= 2

    # fully independent of the histogram (candidates from np.percentile's extreme-tail range, which differs
    # from the histogram's by a little, and on skewed data differently on the two sides): about as good
    p_lo, p_hi = np.percentile(x, [1e-4, 100 - 1e-4])
    raw_errs = raw_errors(x, ifmr_candidates(p_lo, p_hi, floor=floor))
    assert qdq_mse(x, lo, hi) <= 1.1 * raw_errs.min()
    assert qdq_mse(x, lo, hi) < 0.99 * qdq_mse(x, x.min(), x.max())  # and better than minmax
    if floor is not None:
        assert lo == x.min() == 0.0


def test_mse_range_of_a_constant_tensor_is_its_value():
    obs = observe_all(np.full(1000, 2.5))
    assert obs.range("mse") == (2.5, 2.5)
    assert mse_range(np.zeros(16, np.int64) + 3, 1.0, 1.0) == (1.0, 1.0)


def test_quantization_mse_equals_the_error_of_values_at_the_bin_centres():
    rng = np.random.default_rng(13)
    lo, hi, bins = -2.0, 3.0, 64
    hist = rng.integers(0, 50, bins)
    hist[[5, 40]] = 0
    centres = lo + (np.arange(bins) + 0.5) * (hi - lo) / bins
    values = np.repeat(centres, hist)   # the histogram's values, each at its bin centre
    for clip in [(-2.0, 3.0), (-1.0, 1.5), (-0.3, 0.2), (0.5, 3.0)]:
        assert quantization_mse(hist, lo, hi, *clip) == pytest.approx(qdq_mse(values, *clip), rel=1e-9, abs=1e-15)
    # an unclipped range errs by at most half a step; a hard clip errs by the clipped distance
    s, _ = act_qparams(lo, hi)
    assert quantization_mse(hist, lo, hi, lo, hi) <= (s / 2) ** 2
    assert quantization_mse(hist, lo, hi, -0.3, 0.2) > 10 * quantization_mse(hist, lo, hi, lo, hi)


def test_abs_quantile_matches_numpy_within_a_bin():
    rng = np.random.default_rng(14)
    x = np.abs(rng.standard_t(3, 300000))
    amax, bins = float(x.max()), 2048
    hist = np.histogram(x, bins=bins, range=(0.0, amax))[0]
    width = amax / bins
    for q in [0.1, 0.5, 0.9, 0.99, 0.999]:
        assert abs(abs_quantile(hist, amax, q) - np.quantile(x, q)) <= width
    assert abs_quantile(hist, amax, 1.0) == pytest.approx(amax)
    assert abs_quantile(hist, amax, 1.5) == pytest.approx(amax)   # q is capped at 1
    assert abs_quantile(hist, amax, 0.0) == 0.0 and abs_quantile(hist, amax, -1.0) == 0.0
    assert abs_quantile(np.zeros(bins, np.int64), amax, 0.5) == 0.0
    assert abs_quantile(hist, 0.0, 0.5) == 0.0


# --------------------------------------------------------------------------------------------- KL guard
def relu6_like(rng, n=200000, spike=0.005):
    """A bounded ReLU6-like activation: exact zeros, most of the rest tiny, a tenth spread evenly up to 6
    and a spike at 6 -- the shape on which plain entropy calibration clips far inside the range."""
    tiny = rng.exponential(0.002, int(n * (0.9 - spike)))
    spread = rng.uniform(0.0, 6.0, int(n * 0.1))
    x = np.concatenate([np.zeros(n // 5), np.minimum(tiny, 6.0), spread, np.full(int(n * spike), 6.0)])
    rng.shuffle(x)
    return x


def test_kl_guard_limits_the_clipped_fraction_where_plain_kl_clips_far_inside():
    x = relu6_like(np.random.default_rng(15))
    obs = observe_all(x)
    lo_plain, t_plain = obs.range("kl", kl_max_clipped=1.0)
    lo, t = obs.range("kl")   # the guarded default, 1%
    assert lo == lo_plain == 0.0
    clipped_plain, clipped = float((x > t_plain).mean()), float((x > t).mean())
    # plain KL: far inside [0, 6], cutting off several percent of the values
    assert t_plain < 3.0 and clipped_plain > 0.05
    # guarded: at most 1% of the values beyond the threshold (histogram resolution: a few values of one bin)
    assert clipped <= 0.01 + 1e-4
    assert clipped < clipped_plain and t > t_plain
    # and the guard is exactly the 99% quantile of the non-zero |x| (the zeros do not enter the KL search)
    nz = x[x > 0]
    assert t == pytest.approx(np.quantile(nz, 0.99), abs=6.0 / obs.bins)
    # kl_max_clipped=0.05 allows more clipping, but still not more than 5%
    t5 = obs.range("kl", kl_max_clipped=0.05)[1]
    assert t_plain <= t5 <= t and (x > t5).mean() <= 0.05 + 1e-4


def test_kl_guard_does_not_move_a_threshold_that_clips_little():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(size=200000), rng.uniform(-30, 30, 20)])
    obs = observe_all(x)
    plain = obs.range("kl", kl_max_clipped=1.0)
    assert (np.abs(x) > plain[1]).mean() < 0.01
    assert obs.range("kl") == plain


def test_kl_guard_keeps_a_spike_at_the_maximum_on_the_top_code():
    # a 3% spike at 6: the 99% quantile falls inside the top histogram bin, so the guarded threshold lies
    # less than one bin below 6 and the spike still quantizes to the top int8 code with < half a step error
    x = relu6_like(np.random.default_rng(16), spike=0.03)
    obs = observe_all(x)
    t_plain = obs.range("kl", kl_max_clipped=1.0)[1]
    lo, t = obs.range("kl")
    assert t_plain < 3.0
    assert 6.0 - 6.0 / obs.bins <= t <= 6.0
    s, o = act_qparams(lo, t)
    q6 = np.clip(np.round(6.0 / s) + o, QMIN, QMAX)
    assert q6 == QMAX and abs((q6 - o) * s - 6.0) <= s / 2
