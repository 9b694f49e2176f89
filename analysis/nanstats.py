"""np.nanmedian along the last axis, the numbers NumPy gives, without its loop over lines.

On lines of 600 values or more, NumPy calls a one-dimensional function per line
through apply_along_axis: a Python loop over a sweep's 1,000 runs. A line
without NaN gets the same number from np.median, which runs the same partition
on all such lines at once; only lines with a NaN take NumPy's loop.
"""

from __future__ import annotations

import numpy as np

NANMEDIAN_LOOPS_FROM = 600  # line length from which np.nanmedian loops (shorter lines: one masked-array median)


def _by_line(values: np.ndarray, plain, nan_aware) -> np.ndarray:
    """`plain` on the lines of `values` [line, n] without NaN, `nan_aware` on the others, into one result.

    A column that is NaN in every line (a warm-up step left out) is left out of every line first:
    NumPy's own result drops a line's NaNs anyway.
    """
    out = np.empty(values.shape[:-1])
    kept = ~np.isnan(values).all(axis=0)
    if kept.any() and not kept.all():
        values = values[:, kept]
    clean = ~np.isnan(values).any(axis=-1) & kept.any()
    if clean.any():
        out[..., clean] = plain(values[clean])
    if not clean.all():
        out[..., ~clean] = nan_aware(values[~clean])
    return out


def nanmedian(values: np.ndarray) -> np.ndarray:
    """np.nanmedian(values, axis=-1) of a [line, n] array."""
    if values.ndim != 2 or values.shape[-1] < NANMEDIAN_LOOPS_FROM:
        return np.nanmedian(values, axis=-1)
    return _by_line(values, lambda v: np.median(v, axis=-1), lambda v: np.nanmedian(v, axis=-1))
