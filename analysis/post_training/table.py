"""The post-training table (rl.csv, the report's "Post-training aggregation" section): one row per mode.

From the runs against their mode's W=1 grad_accum=1 run (`layouts.layout_table`) and the modes against the
papers' objectives at W=1 (`papers.paper_table`):
- `invariant`: every layout gave the W=1 gradient (NA: the mode ran in one layout only, or every other
  layout failed);
- `changes`: where not, by what and in which axes ("another direction (cos 0.93) with dp; ×2 with sp");
- `changes_with`: those axes;
- `axes_tested`: the axes in which the compared layouts differ from W=1 grad_accum=1, so that `invariant` is
  read as "over these" (a sweep of sp alone says nothing of dp or grad_accum);
- one column per paper's objective: which tokens the mode weighs more than it, or that it weighs them alike;
- `as_expected`: every layout as `custom.expect_layouts` states, every paper's comparison as `custom.weighs`
  states (NA: nothing stated).
"""

from __future__ import annotations

import pandas as pd

from analysis.post_training.layouts import SAME

COMPARED = SAME | {"rescaled", "different"}  # verdicts of a run compared with its mode's W=1 run


def _changes(rows: pd.DataFrame) -> str:
    """Each layout that changed the gradient (or failed), with its axes."""
    parts = []
    for _, row in rows.iterrows():
        if row["verdict"] in SAME or row["verdict"] == "reference":
            continue
        if row["verdict"] in ("rescaled", "different"):
            parts.append(f"{row['change']} with {row['axes'].replace(', ', ' and ')}")
        else:
            parts.append(f"{row['verdict']} at {row['layout']}")
    return "; ".join(parts)


AXES = ("dp", "sp", "grad_accum")


def _axes_of(rows: pd.DataFrame) -> str:
    """The axes named in `rows`' `axes` (dp, sp, grad_accum order)."""
    axes = {axis for text in rows["axes"] for axis in str(text).split(", ") if axis}
    return ", ".join(axis for axis in AXES if axis in axes)


def _changes_with(rows: pd.DataFrame) -> str:
    """The axes the gradient changes with: each axis of a layout that changed it."""
    return _axes_of(rows[rows["verdict"].isin(["rescaled", "different"])])


def _all_true(values: pd.Series):
    """True when every judged value is True, False when one is False, NA when none was judged."""
    judged = values.dropna()
    return pd.NA if judged.empty else bool(judged.all())


def rl_table(layouts: pd.DataFrame, papers: pd.DataFrame) -> pd.DataFrame:
    """One row per (family, mode) of the post-training runs (empty: there are none)."""
    rows = []
    for (family, mode), runs in layouts.groupby(["family", "reduction"], sort=False):
        compared = runs[runs["verdict"].isin(COMPARED)]
        row = {
            "family": family,
            "reduction": mode,
            "mode": runs["name"].iloc[0],
            "weighs": runs["weighs"].iloc[0],
            "layouts": ", ".join(runs["layout"]),
            "invariant": pd.NA if compared.empty else bool(compared["verdict"].isin(SAME).all()),
            "changes": _changes(runs),
            "changes_with": _changes_with(runs),
            "axes_tested": _axes_of(compared),
            "expect_layouts": runs["expect_layouts"].iloc[0],
        }
        against = papers[(papers["family"] == family) & (papers["reduction"] == mode)]
        for _, pair in against.iterrows():
            row[f"vs {pair['paper_name']}"] = pair["difference"]
        judged = pd.concat([runs["as_expected"], against["as_declared"]]).astype(object).where(lambda s: s.notna())
        row["as_expected"] = _all_true(judged)
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    papers_first = [c for c in table.columns if c.startswith("vs ")]
    ordered = [c for c in table.columns if c not in papers_first and c != "as_expected"] + papers_first
    return table[ordered + ["as_expected"]].astype({"invariant": "boolean", "as_expected": "boolean"})
