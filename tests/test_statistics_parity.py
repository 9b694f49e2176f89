"""The cost analysis's statistics (analysis/cost/randomization.py) held to scipy and statsmodels.

- `signed_rank_null(n)`: its CDF against `scipy.stats.wilcoxon(method="exact", alternative="less")`,
  read on data built to have each W+ = 0 .. n(n+1)/2.
- `signed_rank_shift(...).p_value` (two-sided, the only alternative the project uses): on untied
  data, against `scipy.stats.wilcoxon(method="exact")`. With ties or zeros, against scipy's exact
  permutation test (`method=PermutationMethod(n_resamples=inf)`, every one of the 2^n sign flips)
  with `zero_method="zsplit"`, the project's convention (a zero's rank counts half on each side;
  scipy's default drops zeros). scipy's docs say `method="exact"` is not exact there (it rounds a
  non-integral W+ conservatively), so it is no reference for those cases.
- The Hodges-Lehmann estimate: the median of Walsh averages built here pair by pair.
- The confidence interval: the closure of the shifts delta that scipy's exact two-sided test at
  level 1 - confidence does not reject (p > level), scanned at a point in every gap between
  consecutive Walsh averages. That pins the project's convention: coverage at least `confidence`,
  the narrowest such. Where no shift can be rejected at all (n too small for the level), the true
  interval is the whole line and the project returns the widest Walsh span instead; the caller
  never asks (MIN_STEPS).
- `_average_ranks`: `scipy.stats.rankdata(method="average")`.
- `holm`: `statsmodels.stats.multitest.multipletests(p, method="holm")[1]`.
"""

from __future__ import annotations

import gc
import itertools
import statistics

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from analysis.cost.interleaved import MIN_STEPS
from analysis.cost.randomization import _average_ranks, holm, signed_rank_null, signed_rank_shift

SIZES = range(5, 26)
EXHAUSTIVE = stats.PermutationMethod(n_resamples=np.inf)


def differences(rng: np.random.Generator, n: int) -> np.ndarray:
    """Untied paired differences like the project's: extra seconds, or log ratios of timings, with
    a shift from none to large, light or heavy tails."""
    shift = rng.choice([0.0, 0.2, 0.5, 1.5]) * rng.choice([-1, 1])
    kind = rng.integers(3)
    if kind == 0:
        return shift + rng.normal(size=n)
    if kind == 1:
        return shift + rng.standard_t(2, size=n)
    load = np.exp(rng.normal(0, 0.2, size=n))  # the step's machine load, shared by both arms
    local = 0.03 * load * np.exp(rng.normal(0, 0.05, size=n))
    return np.log(0.03 * load * np.exp(shift / 10 + rng.normal(0, 0.05, size=n)) / local)


def with_statistic(n: int, w: int) -> np.ndarray:
    """Differences +-1..+-n whose W+ is `w`: the largest ranks that still fit carry the +."""
    signs = np.empty(n)
    for rank in range(n, 0, -1):
        signs[rank - 1] = 1 if rank <= w else -1
        w -= rank if rank <= w else 0
    return signs * np.arange(1, n + 1)


@pytest.mark.parametrize("n", range(1, 31))
def test_null_distribution_is_scipys_exact_one(n):
    top = n * (n + 1) // 2
    rows = np.stack([with_statistic(n, w) for w in range(top + 1)])
    assert (np.where(rows > 0, np.abs(rows), 0).sum(axis=1) == np.arange(top + 1)).all()
    expected = stats.wilcoxon(rows, axis=1, method="exact", alternative="less").pvalue
    np.testing.assert_allclose(np.cumsum(signed_rank_null(n)), expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("n", [*SIZES, 40, 60])
def test_p_value_is_scipys_exact_two_sided_one(n):
    rng = np.random.default_rng(n)
    for _ in range(25):
        d = differences(rng, n)
        assert len(np.unique(np.abs(d))) == n and (d != 0).all()
        expected = stats.wilcoxon(d, method="exact").pvalue
        assert signed_rank_shift(d).p_value == pytest.approx(expected, rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("n", range(6, 12))  # scipy enumerates 2^n sign flips: slow beyond
def test_p_value_with_ties_and_zeros_is_the_exact_permutation_one(n):
    rng = np.random.default_rng(100 + n)
    tied = zeros = 0
    for case in range(8):
        d = np.round(rng.normal(rng.choice([0.0, 0.4, 1.0]), 1, size=n), 1)
        d[: case % 3] = 0.0  # no, one or two zeros
        d[-1] = -d[-2] if case % 2 else d[-1]  # and a tie of opposite signs
        tied += len(np.unique(np.abs(d[d != 0]))) < (d != 0).sum()
        zeros += (d == 0).any()
        expected = stats.wilcoxon(d, zero_method="zsplit", method=EXHAUSTIVE).pvalue
        assert signed_rank_shift(d).p_value == pytest.approx(expected, rel=1e-12, abs=1e-14)
    assert tied >= 4 and zeros >= 5  # the cases this test is for


def walsh_averages(d: np.ndarray) -> list[float]:
    return [(a + b) / 2 for a, b in itertools.combinations_with_replacement(d, 2)]


def inverted_interval(d: np.ndarray, confidence: float) -> tuple[float, float]:
    """The closure of the shifts scipy's exact two-sided signed-rank test does not reject."""
    walsh = np.unique(walsh_averages(d))
    probes = np.r_[walsh[0] - 1, (walsh[1:] + walsh[:-1]) / 2, walsh[-1] + 1]  # one per gap
    p = stats.wilcoxon(d[None, :] - probes[:, None], axis=1, method="exact").pvalue
    accepted = np.flatnonzero(p > 1 - confidence)
    assert (np.diff(accepted) == 1).all(), "the accepted shifts are not one interval"
    edges = np.r_[-np.inf, walsh, np.inf]  # probe i lies between edges i and i + 1
    return float(edges[accepted[0]]), float(edges[accepted[-1] + 1])


@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
@pytest.mark.parametrize("n", SIZES)
def test_shift_and_interval_invert_scipys_exact_test(n, confidence):
    rng = np.random.default_rng([n, int(confidence * 100)])
    for _ in range(6):
        d = differences(rng, n)
        shift = signed_rank_shift(d, confidence)
        assert shift.steps == n
        assert shift.estimate == pytest.approx(statistics.median(walsh_averages(d)), rel=1e-12, abs=1e-15)
        low, high = inverted_interval(d, confidence)
        if np.isfinite(low):
            assert (shift.low, shift.high) == pytest.approx((low, high), rel=1e-12, abs=1e-15)
        else:  # no shift is rejected: the project's convention, the widest Walsh span
            assert 2 * 0.5**n > 1 - confidence and np.isinf(high)
            assert (shift.low, shift.high) == (min(walsh_averages(d)), max(walsh_averages(d)))
        assert shift.low <= shift.estimate <= shift.high


def test_the_fewest_steps_the_caller_accepts_get_a_finite_95_percent_interval():
    assert 2 * 0.5**MIN_STEPS <= 0.05 < 2 * 0.5 ** (MIN_STEPS - 1)
    d = differences(np.random.default_rng(0), MIN_STEPS)
    assert np.isfinite(inverted_interval(d, 0.95)).all()


def test_average_ranks_are_scipys():
    rng = np.random.default_rng(5)
    for n in range(1, 40):
        values = np.abs(np.round(rng.normal(size=n), int(rng.integers(0, 3))))
        np.testing.assert_array_equal(_average_ranks(values), stats.rankdata(values, method="average"))


def p_value_families(rng: np.random.Generator):
    near_one = [1.0, 1 - 1e-12, 0.999, 0.98, 0.5]
    for m in range(1, 13):
        for _ in range(15):
            yield rng.uniform(size=m)
            yield rng.choice([0.001, 0.01, 0.02, 0.04, 0.3, *near_one], size=m)  # ties, and values near 1
            yield rng.uniform(size=m) ** 6  # mostly small, where the step-down matters
            yield np.repeat(rng.uniform(), m)
    yield np.array([0.0, 0.0, 1e-300, 1.0, 1.0])


def test_holm_is_statsmodels(monkeypatch):
    # statsmodels' holm runs a full gc.collect() per call, 0.1 s or more in a test process: skipped.
    monkeypatch.setattr(gc, "collect", lambda generation=2: 0)
    for p in p_value_families(np.random.default_rng(11)):
        expected = multipletests(p, method="holm")[1]
        np.testing.assert_allclose(holm(p), expected, rtol=1e-12, atol=1e-15)
