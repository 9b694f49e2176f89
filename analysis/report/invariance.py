"""The report's "Invariance to the layout" section: does a mode's loss curve change with the layout? Its answer,
then invariance.csv as a table."""

from __future__ import annotations

import pandas as pd

from analysis.report.markdown import listed, names, table


def invariance_sentence(summary: pd.DataFrame) -> str:
    if summary.empty:
        return ""
    invariant = summary[summary["invariant"]]["reduction"].unique().tolist()
    changing = summary[~summary["invariant"]]
    parts = []
    if invariant:
        verb = "gives" if len(invariant) == 1 else "give"
        parts.append(", ".join(f"`{m}`" for m in invariant) + f" {verb} the same loss curve for every layout tried")
    for axes, rows in changing.groupby("changes_with"):
        modes = rows["reduction"].unique()
        verb = "changes" if len(modes) == 1 else "change"
        parts.append(", ".join(f"`{m}`" for m in modes) + f" {verb} with {axes.replace(', ', ' and ')}")
    return "Layouts at a fixed global batch: " + "; ".join(parts) + "."


def _same_curve(modes: list[str]) -> str:
    return f"{names(modes)} {'gives' if len(modes) == 1 else 'give'} the same curve in every layout tried"


QUESTION = "Does a mode's loss curve change with the layout (at a fixed global batch)?"


def invariance_answer(summary: pd.DataFrame) -> str:
    """The section's answer in one sentence, from `analysis.gradients.invariance.invariance_summary`."""
    if summary.empty:
        return (
            f"{QUESTION} Not measured: every config ran in one layout (sweep world_size, sp or grad_accum to see this)."
        )
    invariant = summary.loc[summary["invariant"], "reduction"].unique().tolist()
    changing = summary[~summary["invariant"]]
    if changing.empty:
        return f"{QUESTION} No, {_same_curve(invariant)}."
    changes = [
        f"{names(rows['reduction'].unique())} with {axes.replace(', ', ' and ')}"
        for axes, rows in changing.groupby("changes_with")
    ]
    same = f"; {_same_curve(invariant)}" if invariant else ""
    return f"{QUESTION} Yes, {listed(changes)}{same}."


def invariance_section(invariance: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    sections = ["## Invariance to the layout", "", invariance_answer(summary), ""]
    if invariance.empty:
        return sections
    return sections + [
        table(invariance.drop(columns=["family"]) if invariance["family"].nunique() <= 1 else invariance),
        "",
    ]
