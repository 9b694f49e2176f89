"""The report's "Verdicts" section (is every verdict the one its mode should give? Its answer, verdicts.csv as a
table, and the tolerances that decide), and the runs that did not complete."""

from __future__ import annotations

import pandas as pd

from analysis.gradients.tolerances import Tolerances
from analysis.report.markdown import by_mode, count, table

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


QUESTION = "Is every verdict the one its mode should give?"


def verdicts_answer(verdicts: pd.DataFrame) -> str:
    """Whether every judged verdict is the one its mode should give (`expected`; what `--check` tests)."""
    judged = verdicts[verdicts["as_expected"].notna()]
    unjudged = len(verdicts) - len(judged)
    aside = (
        f" ({count(unjudged, 'run')} not judged: never ran, or a custom rule without custom.expect)" if unjudged else ""
    )
    if judged.empty:
        return f"{QUESTION} None could be judged{aside}."
    wrong = judged[judged["as_expected"].eq(False)]
    if wrong.empty:
        return f"{QUESTION} Yes, {'the one judged' if len(judged) == 1 else f'all {len(judged)} judged'}{aside}."
    shown = "; ".join(
        f"`{row.reduction}` in {row.group_label}: {row.verdict_text}, expected {row.expected}"
        for row in by_mode(wrong).head(3).itertuples()
    )
    more = f"; {len(wrong) - 3} more in the table" if len(wrong) > 3 else ""
    return f"{QUESTION} No, {len(wrong)} of {len(judged)} differ ({shown}{more}){aside}."


def dropout_note(verdicts: pd.DataFrame) -> list[str]:
    """The runs whose model has dropout, each judged against its own layout's `sum` run, in one sentence."""
    kinds = verdicts.get("baseline_kind", pd.Series(dtype=object)).astype(str)
    judged = verdicts[kinds.str.contains("dropout", regex=False)]
    if judged.empty:
        return []
    return [
        f"{count(len(judged), 'run')} trained with dropout: each is judged against the `sum` run of its own layout, "
        "which drew the same masks (seeded by seed, step and rank); layouts draw different masks, so these "
        "verdicts say nothing about agreement across layouts or with the single-process reference.",
        "",
    ]


def verdicts_section(verdicts: pd.DataFrame, tol: Tolerances) -> list[str]:
    return [
        "## Verdicts",
        "",
        verdicts_answer(verdicts),
        "",
        *dropout_note(verdicts),
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
    statuses = ", ".join(f"{n} {status}" for status, n in not_ok["status"].value_counts().sort_index().items())
    return [
        "## Runs that did not complete",
        "",
        f"Did every run complete? No, {len(not_ok)} of {len(runs)} did not ({statuses}).",
        "",
        table(not_ok[["run", "status", "steps_done", "diverged_at", "error"]]),
        "",
    ]
