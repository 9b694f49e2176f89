"""The report's "Verdicts" section (verdicts.csv as a table, and the tolerances that decide), and the runs that
did not complete."""

from __future__ import annotations

import pandas as pd

from analysis.gradients.tolerances import Tolerances
from analysis.report.markdown import by_mode, table

VERDICT_COLUMNS = {
    "group_label": "group",
    "reduction": "mode",
    "verdict_text": "verdict",
    "expected": "expected",
    "sketch_cos_step1": "cos@1",
    "factor": "scale@1",
    "grad_norm_ratio_median": "|g| ratio (median)",
    "loss_max_abs_diff": "max |Δloss|",
    "final_loss_diff": "final Δloss",
    "first_step_beyond": "departs at",
    "clip_active_frac": "clipped",
}


def verdicts_section(verdicts: pd.DataFrame, tol: Tolerances) -> list[str]:
    return [
        "## Verdicts",
        "",
        table(by_mode(verdicts)[list(VERDICT_COLUMNS)].rename(columns=VERDICT_COLUMNS)),
        "",
        f"Tolerances: loss curves match while |Δloss| <= {tol.loss_rtol:g} × the baseline's loss; "
        f"the direction is the same while 1 - cos <= {tol.cos_tol:g} (gradient sketch at step 1); "
        f"the scale is unchanged while |k - 1| <= {tol.scale_rtol:g}. Every number and its reason: verdicts.csv.",
        "",
    ]


def incomplete_section(runs: pd.DataFrame) -> list[str]:
    """The runs that did not complete (none: no section)."""
    not_ok = runs[runs["status"] != "completed"]
    if not len(not_ok):
        return []
    return [
        "## Runs that did not complete",
        "",
        table(not_ok[["run", "status", "steps_done", "diverged_at", "error"]]),
        "",
    ]
