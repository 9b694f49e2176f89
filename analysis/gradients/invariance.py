"""Does a mode's loss curve change with the parallel layout at a fixed global batch?

Every step's global batch is the same whatever the layout (it is drawn from
the seed and the step alone), so a mode that computes the gradient of the global token-mean loss gives
the same curve for every world_size, sp, grad_accum, dp_replicate, tp and pp, up to float rounding.
For each mode and axis, each run is compared with the run of the same family
and mode that differs from it only in that axis, at the axis's smallest value
(world_size=1, sp=1, grad_accum=1, dp_replicate=1, tp=1, pp=1 where they ran).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.gradients.groups import LAYOUT
from analysis.gradients.measures import departs, first_true
from analysis.gradients.tolerances import Tolerances

COLUMNS = ["family", "reduction", "axis", "values", "pairs", "max_rel_diff", "first_step_beyond", "changes"]


def _pair_deviation(loss: np.ndarray, logged: np.ndarray, i: np.ndarray, j: np.ndarray, tol: Tolerances):
    """Max relative loss difference of runs i vs j over their shared steps, and the first step beyond tolerance."""
    shared = logged[i] & logged[j]
    a, b = loss[i], loss[j]
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.abs(a - b) / np.abs(b)
    finite = shared & np.isfinite(rel)
    max_rel = np.where(finite.any(axis=1), np.where(finite, rel, 0).max(axis=1), np.nan)
    return max_rel, first_true(departs(a, b, shared, tol))


def invariance(runs: pd.DataFrame, loss: np.ndarray, logged: np.ndarray, tol: Tolerances) -> pd.DataFrame:
    """One row per (family, mode, axis) that the runs vary: how far the curves move along that axis."""
    done = runs[runs["status"].isin(["completed", "diverged"])]
    done = done.assign(row=runs.index.get_indexer(done.index))  # the run's row in `loss` and `logged`
    rows = []
    for axis in LAYOUT:
        others = ["family", "reduction", *[a for a in LAYOUT if a != axis]]
        smallest = done.loc[done.groupby(others)[axis].idxmin()]
        pairs = done.merge(smallest[[*others, axis, "row"]], on=others, suffixes=("", "_ref"))
        pairs = pairs[pairs[axis] != pairs[f"{axis}_ref"]]
        if pairs.empty:
            continue
        pairs["max_rel_diff"], pairs["first_step_beyond"] = _pair_deviation(
            loss, logged, pairs["row"].to_numpy(), pairs["row_ref"].to_numpy(), tol
        )
        for (family, mode), one in pairs.groupby(["family", "reduction"], sort=False):
            values = sorted({*one[f"{axis}_ref"], *one[axis]})
            rows.append(
                {
                    "family": family,
                    "reduction": mode,
                    "axis": axis,
                    "values": ",".join(map(str, values)),
                    "pairs": len(one),
                    "max_rel_diff": one["max_rel_diff"].max(),
                    "first_step_beyond": one["first_step_beyond"].min(),
                    "changes": bool(one["first_step_beyond"].notna().any()),
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def invariance_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per (family, mode): invariant or the axes its curve changes with."""
    if table.empty:
        return pd.DataFrame(columns=["family", "reduction", "invariant", "changes_with"])
    by_mode = table.assign(changed_axis=table["axis"].where(table["changes"])).groupby(
        ["family", "reduction"], sort=False
    )
    summary = pd.DataFrame(
        {
            "invariant": ~by_mode["changes"].any(),
            "changes_with": by_mode["changed_axis"].agg(lambda axes: ", ".join(axes.dropna())),
            "max_rel_diff": by_mode["max_rel_diff"].max(),
        }
    )
    return summary.reset_index()
