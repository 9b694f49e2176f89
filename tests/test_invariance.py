"""invariance_summary: per (family, mode), invariant or the axes (in table order) its curve changes with."""

from __future__ import annotations

import pandas as pd

from analysis.gradients.invariance import COLUMNS, invariance_summary


def test_summary_names_the_axes_a_mode_changes_with():
    rows = [
        ("f1", "sum", "world_size", "1,2", 1, 0.0, None, False),
        ("f1", "sum", "grad_accum", "1,2", 1, 1e-7, None, False),
        ("f1", "local", "world_size", "1,2,4", 2, 0.03, 22.0, True),
        ("f1", "local", "sp", "1,2", 1, 1e-6, None, False),
        ("f1", "local", "grad_accum", "1,2", 1, 0.05, 9.0, True),
        ("f2", "sum", "world_size", "1,2", 1, 2e-7, None, False),
    ]
    summary = invariance_summary(pd.DataFrame(rows, columns=COLUMNS))
    assert summary.to_dict("list") == {
        "family": ["f1", "f1", "f2"],
        "reduction": ["sum", "local", "sum"],
        "invariant": [True, False, True],
        "changes_with": ["", "world_size, grad_accum", ""],
        "max_rel_diff": [1e-7, 0.05, 2e-7],
    }
    assert summary["invariant"].dtype == bool
    assert invariance_summary(pd.DataFrame(columns=COLUMNS)).empty
