"""analysis.nanstats gives exactly NumPy's nanmedian (bit for bit): NaN, inf, all-NaN lines and columns included."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from analysis import nanstats


def _lines(n_lines: int, length: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.lognormal(size=(n_lines, length))
    values[10:15, rng.integers(0, length, size=2)] = np.nan  # lines with a NaN or two
    values[3, :] = np.nan  # a line with nothing
    values[5, 10:] = np.nan  # a line cut short
    values[7, 2] = np.inf
    return values


def _warm_up_left_out(n_lines: int, length: int, seed: int) -> np.ndarray:
    values = _lines(n_lines, length, seed)
    values[:, :5] = np.nan  # as comm_table leaves out the first steps of every run
    return values


@pytest.mark.parametrize("make", [_lines, _warm_up_left_out])
@pytest.mark.parametrize("length", [30, 599, 600, 603, 1000, 1001])
def test_nanmedian_is_numpys(length, make):
    values = make(40, length, seed=length)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ours, numpys = nanstats.nanmedian(values), np.nanmedian(values, axis=-1)
    assert np.array_equal(ours, numpys, equal_nan=True)
    assert np.isnan(values[:, 5:]).any(axis=1).sum() == 7  # the other lines take the fast path
