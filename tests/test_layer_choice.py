"""benchmarks.layer_choice's rank correlation (its measurement needs a built example: docs/accuracy.md)."""
import numpy as np
import pytest
from scipy.stats import spearmanr

from benchmarks.layer_choice import spearman


def test_spearman_is_scipys_rank_correlation_and_ignores_monotone_rescaling():
    rng = np.random.default_rng(3)
    a = rng.normal(size=48)
    b = a + rng.normal(scale=2.0, size=48)
    assert spearman(a, b) == pytest.approx(spearmanr(a, b)[0])
    assert spearman(a, np.exp(b)) == pytest.approx(spearman(a, b))
    assert spearman(a, -a) == pytest.approx(-1.0) and spearman(a, a ** 3) == pytest.approx(1.0)
