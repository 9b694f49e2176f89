"""Inference from the interleaved cost measurement's own randomisation.

Every step of a cost job runs its arms in an order drawn at random, independently
of everything else. Under the null hypothesis that a mode costs what `local`
costs, which of the two arms of a step carries which name is then exchangeable:
swapping them gives another order that was just as likely. So, given the size
|d_t| of each step's paired difference d_t = T[t, mode] - T[t, local], its sign
is a fair coin, independent between steps, whatever the machine's load does
over time (its correlation between steps moves |d_t|, not the coin). The
Wilcoxon signed-rank test on the d_t is therefore exact: its null distribution
is that of sum_t s_t rank(|d_t|) over independent fair signs s_t, counted
exactly below. Ties are rare in timings and get the average rank, and a zero
difference counts half its rank on each side; the p-value then comes from the
null of those very ranks (doubled, so that they are integers), which keeps it
exact. (The integer-rank null read at a non-integral W+ would not be: off either
way, too small by up to 0.09 at n = 6..13; scipy's method="exact", which rounds
such a W+ conservatively, is mostly too big.)

Inverting the test for a shift (the mode costs `local` plus delta, on every step)
gives a confidence interval: the deltas the test does not reject. Its centre is
the Hodges-Lehmann estimate, the median of the Walsh averages
(d_i + d_j) / 2, i <= j, and its ends are order statistics of those averages at
the test's critical value. Applied to d_t (seconds) it gives the extra time; to
log(T[t, mode] / T[t, local]) the ratio, exponentiated.

Several modes and null controls tested in one job are corrected with Holm's
step-down method, so that the chance of any false "resolved" on an unchanged
machine stays at or under the level.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@functools.lru_cache(maxsize=64)
def signed_rank_null(n: int) -> np.ndarray:
    """P(W+ = w) for w = 0 .. n(n+1)/2: the signed-rank statistic's exact null distribution for n steps
    (each rank 1..n carries a + with probability 1/2, independently). Read-only: it is cached."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    top = 0
    for rank in range(1, n + 1):
        counts[rank : top + rank + 1] += counts[: top + 1].copy()  # subsets that include this rank
        top += rank
        counts /= 2  # keep it a probability as it grows (2^n overflows float64 past n = 1023)
    counts.flags.writeable = False
    return counts


@dataclass(frozen=True)
class Shift:
    estimate: float  # Hodges-Lehmann: median of the Walsh averages
    low: float  # the confidence interval that inverts the signed-rank test
    high: float
    p_value: float  # two-sided, of "no shift"
    steps: int


def signed_rank_shift(d: np.ndarray, confidence: float = 0.95) -> Shift:
    """The Hodges-Lehmann shift of paired differences `d`, its CI by inverting the exact signed-rank
    test, and that test's two-sided p-value for a shift of 0."""
    d = np.asarray(d, dtype=float)
    d = d[np.isfinite(d)]
    n = len(d)
    if n < 2:
        return Shift(np.nan, np.nan, np.nan, np.nan, n)
    cdf = np.cumsum(signed_rank_null(n))
    ranks = _average_ranks(np.abs(d))
    # Twice W+, with a zero's rank split between the sides: an integer, as ranks are (half-)integers.
    twice_w = int(round(2 * ranks[d > 0].sum() + ranks[d == 0].sum()))
    if (d != 0).all() and len(np.unique(np.abs(d))) == n:  # ranks 1..n: the cached null
        null_cdf, w = cdf, twice_w // 2
    else:  # ties or zeros: the null of these ranks, doubled; the zeros' halves are not random
        null_cdf = np.cumsum(_doubled_rank_null(np.rint(2 * ranks[d != 0]).astype(int)))
        w = twice_w - int(round(ranks[d == 0].sum()))
    below = null_cdf[w]  # P(W+ <= w)
    above = 1 - (null_cdf[w - 1] if w >= 1 else 0.0)  # P(W+ >= w)
    p_value = min(1.0, 2 * min(below, above))
    walsh = np.sort((d[:, None] + d[None, :])[np.triu_indices(n)] / 2)  # M = n(n+1)/2 averages
    # The test rejects shifts whose W+ falls in either tail of mass <= (1 - confidence) / 2; the
    # accepted ones lie between the k-th smallest and the k-th largest Walsh average.
    k = int(np.searchsorted(cdf, (1 - confidence) / 2, side="right"))
    k = max(k, 1)
    return Shift(float(np.median(walsh)), float(walsh[k - 1]), float(walsh[len(walsh) - k]), float(p_value), n)


def _doubled_rank_null(doubled: np.ndarray) -> np.ndarray:
    """P(V = v) for V = sum of the `doubled` ranks that carry a +, each with probability 1/2."""
    counts = np.zeros(int(doubled.sum()) + 1)
    counts[0] = 1.0
    top = 0
    for rank in doubled:
        counts[rank : top + rank + 1] += counts[: top + 1].copy()
        top += rank
        counts /= 2
    return counts


def _average_ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    sorted_values = values[order]
    # Ties share the average of their ranks.
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], len(values)]
    for start, end in zip(starts, ends):
        if end - start > 1:
            ranks[order[start:end]] = (start + 1 + end) / 2
    return ranks


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values: reject where adjusted <= level, family-wise error <= level."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p)
    m = len(p)
    adjusted = np.empty(m)
    running = 0.0
    for position, index in enumerate(order):
        running = max(running, min(1.0, (m - position) * p[index]))
        adjusted[index] = running
    return adjusted
