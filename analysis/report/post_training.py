"""The report's "Post-training aggregation" section: which modes' gradients are invariant to the layout, then
rl.csv as a table (each mode against itself at W=1 grad_accum=1, and against each paper's objective at W=1)."""

from __future__ import annotations

import pandas as pd

from analysis.post_training.table import AXES
from analysis.report.markdown import count, listed, names, table

QUESTION = (
    "Is every post-training mode's gradient invariant to the layout (against the same mode at W=1, grad_accum=1)?"
)
CAPTION = (
    "Each mode's step-1 gradient at each layout against its own at one process (DP(1)-SP(1)-GA(1)): the same, "
    "×k (the same direction, k times as large) or another direction (the cosine of the two gradient sketches)."
)


def _axes(axes: str) -> str:
    return listed(axes.split(", ")) if axes else "the layout"


def post_training_answer(rl: pd.DataFrame) -> str:
    """The section's answer in one sentence, from `analysis.post_training.table.rl_table`."""
    compared = rl[rl["invariant"].notna()]
    if compared.empty:
        return f"{QUESTION} Not measured: every mode ran at one layout (sweep layout=w1,w1_ga2,w2,w2_sp2)."
    invariant = compared.loc[compared["invariant"].astype(bool), "mode"].tolist()
    changing = compared[~compared["invariant"].astype(bool)]
    varied = {axis for text in compared["axes_tested"] for axis in text.split(", ") if axis}
    untested = [axis for axis in AXES if axis not in varied]
    scope = (
        f" (over the axes this analysis varied: {listed([a for a in AXES if a in varied])}; "
        f"{listed(untested)} not varied, so not tested)"
        if untested
        else ""
    )
    if changing.empty:
        return f"{QUESTION} Yes, all {len(invariant)} are{scope}."
    kind = ["direction" if "direction" in text else "by a factor" for text in changing["changes"]]
    groups = changing.assign(kind=kind).groupby(["changes_with", "kind"], sort=False)
    changes = [
        f"{names(rows['mode'])} {'changes' if len(rows) == 1 else 'change'} {what} with {_axes(axes)}"
        for (axes, what), rows in groups
    ]
    head = f"No, {len(invariant)} of {len(compared)} {'is' if len(invariant) == 1 else 'are'}" + (
        f" ({names(invariant)})" if invariant else ""
    )
    return f"{QUESTION} {head}; {listed(changes)}{scope}."


def _expectation_sentence(rl: pd.DataFrame) -> str:
    judged = rl[rl["as_expected"].notna()]
    if judged.empty:
        return "No mode states what it should give (custom.expect_layouts, custom.weighs): none is judged."
    off = judged[~judged["as_expected"].astype(bool)]
    if off.empty:
        return (
            f"All {count(len(judged), 'mode')} judged give what they state at every layout (custom.expect_layouts) "
            "and against every paper (custom.weighs)."
        )
    return f"NOT as stated: {names(off['mode'])} (rl_runs.csv and rl_papers.csv hold each run's numbers)."


def _shown(rl: pd.DataFrame) -> pd.DataFrame:
    shown = rl.drop(columns=["family", "reduction", "layouts", "changes_with"] if rl["family"].nunique() <= 1 else [])
    shown = shown.drop(columns=[c for c in ("reduction", "layouts", "changes_with") if c in shown])
    tested = shown.pop("axes_tested")
    for column in [c for c in shown.columns if c.startswith("vs ")]:
        shown[column] = shown[column].fillna("(itself)")
    shown["invariant"] = [
        "" if pd.isna(v) else f"yes, over {axes}" if v else "no" for v, axes in zip(shown["invariant"], tested)
    ]
    shown["as_expected"] = shown["as_expected"].map(lambda v: "not stated" if pd.isna(v) else "yes" if v else "NO")
    return shown.rename(
        columns={
            "weighs": "weighs alike",
            "changes": "changes (against W=1, grad_accum=1)",
            "expect_layouts": "stated",
            "as_expected": "as stated",
        }
    )


def post_training_section(rl: pd.DataFrame) -> list[str]:
    """The section (empty where the analysis holds no objective=pg run)."""
    if rl is None or rl.empty:
        return []
    papers = [c[3:] for c in rl.columns if c.startswith("vs ")]
    lines = ["## Post-training aggregation", "", post_training_answer(rl), "", table(_shown(rl)), ""]
    lines += [
        _expectation_sentence(rl),
        "",
        "Each mode's step-1 gradient at every layout against its own at W=1, grad_accum=1 (every layout trains on "
        "the same tokens and advantages): the same, ×k, or another direction (cosine of the gradient sketches); "
        "the axes are those in which the layout differs (dp, sp, grad_accum). "
        + (
            f"Against {listed(papers)} at W=1: which tokens a mode weighs more than the paper's objective, from "
            "what each weighs alike (custom.weighs), the measured direction agreeing (parallel only where both "
            "weigh the same unit; ×k: the mode's gradient is k times the paper's). "
            if papers
            else ""
        )
        + "rl.csv; each run in rl_runs.csv, each paper comparison in rl_papers.csv; post_training.png draws it.",
        "",
    ]
    return lines
