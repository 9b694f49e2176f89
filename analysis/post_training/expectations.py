"""What a post-training run (objective=pg) should show, from its config and `runner.modes`' rules.

- Against the same mode at W=1 grad_accum=1: a custom rule's `custom.expect_layouts`
  (`runner.modes.layout_expectation`: `invariant`, `x AXIS`, `changes with AXIS[, AXIS]`); a built-in mode's
  from its gradient against grad L (`runner.modes.FACTS`): grad L is the same at every layout, so `sum`,
  `fsdp_sum` and `scaled` are invariant, `local` and `detached` (grad L / W) change by 1/W, `mean_of_means`
  (a mean of micro-batch means) changes direction with dp and grad_accum.
- "changes with" states another direction where response lengths differ. With every response of one length
  (`objective.min_response` = `objective.max_response`) a mean of means weighs tokens alike again, so the
  layout may leave such a gradient as it is: either is accepted there.
- What its objective weighs alike at W=1 (`custom.weighs`, `runner.modes.UNITS`); every built-in mode gives grad
  L at W=1 grad_accum=1, the token mean: it weighs every token alike.
"""

from __future__ import annotations

import pandas as pd

from runner.modes import OVER_W, REWEIGHTED, TRUE, layout_expectation

# A built-in mode's gradient (`analysis.load.mode_labels`' `gradient` column) as a layout expectation.
BUILT_IN_LAYOUTS = {TRUE: "invariant", REWEIGHTED: "changes with dp, grad_accum"}
BUILT_IN_WEIGHS = "token"
EITHER = "either"  # invariant or another direction: lengths equal, a "changes with" rule may stay invariant


def is_post_training(runs: pd.DataFrame) -> pd.Series:
    """The runs of objective=pg (runs recorded before objectives existed are cross-entropy)."""
    return runs.get("objective.name", pd.Series(None, index=runs.index)).eq("pg")


def stated_layouts(row: pd.Series) -> str | None:
    """The run's layout expectation in `custom.expect_layouts`' words (None: it states none)."""
    if row["gradient"] in BUILT_IN_LAYOUTS:
        return BUILT_IN_LAYOUTS[row["gradient"]]
    if row["gradient"] == OVER_W:
        return "x 1/W"
    expect = row.get("custom.expect_layouts")
    return expect if isinstance(expect, str) else None


def _size(row: pd.Series, axis: str) -> int:
    """The row's tp or pp: 1 where its config predates the key (absent, or NaN beside newer runs)."""
    size = row.get(axis, 1)
    return 1 if pd.isna(size) else int(size)


def expected_change(row: pd.Series) -> float | str | None:
    """What the run's gradient should be against the same mode at W=1 grad_accum=1: a factor k (1.0: the
    same), "different", EITHER, or None (not stated, or not readable)."""
    stated = stated_layouts(row)
    if stated is None:
        return None
    # world: the data ranks (world_size / (tp x pp)), whose tokens differ; the tp ranks of a group and the pp
    # stages of a pipeline share theirs (a row without tp or pp: a config written before the key, 1)
    world = int(row["world_size"]) // (_size(row, "tp") * _size(row, "pp"))
    sp, grad_accum = int(row["sp"]), int(row["grad_accum"])
    if stated == "x 1/W":
        return 1.0 / world
    try:
        expected = layout_expectation(stated, world // sp, sp, grad_accum)
    except ValueError:
        return None
    lengths_equal = row.get("objective.min_response") == row.get("objective.max_response")
    if expected == "different" and stated.strip().lower().startswith("changes with") and lengths_equal:
        return EITHER
    return expected


def weighs(row: pd.Series) -> str | None:
    """What the run's objective weighs alike at W=1 (`runner.modes.UNITS`); None where a custom rule states
    nothing."""
    if row["gradient"] in (TRUE, OVER_W, REWEIGHTED):
        return BUILT_IN_WEIGHS
    unit = row.get("custom.weighs")
    return unit if isinstance(unit, str) else None
