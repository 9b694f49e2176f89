"""Each post-training mode against each paper's objective, both at W=1 grad_accum=1: which tokens it weighs more.

A paper's objective is a run whose rule writes out a published objective (its summary's `custom_upstream`
holds a paper: the `paper` column of the runs). At one process every mode computes its objective as written, so
the step-1 gradients compare the objectives themselves: a gradient parallel to the paper's (cosine 1, scale k:
the mode's gradient is k times the paper's) weighs every token as the paper does, up to k; another direction
weighs some tokens more. Which ones follows from what each objective weighs alike (`custom.weighs`,
`runner.modes.UNITS` and `heavier_tokens`: a token-mean weighs long responses' tokens more than a per-response
mean does), and the measured direction must agree with it: parallel exactly where the two weigh the same unit
(`as_declared`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.gradients.tolerances import Tolerances
from analysis.gradients.verdicts import factor_label
from analysis.load.arrays import step_stack
from analysis.post_training.layouts import steps_of
from runner.modes import heavier_tokens

COLUMNS = [
    "family",
    "reduction",
    "name",
    "paper",
    "paper_name",
    "weighs",
    "paper_weighs",
    "scale",
    "cos",
    "parallel",
    "heavier",
    "difference",
    "as_declared",
]


def step1_sketches(steps: pd.DataFrame, run_ids: pd.Series) -> np.ndarray:
    """[run, k]: each run's step-1 gradient sketch (NaN where it has none)."""
    columns = sorted((c for c in steps.columns if c.startswith("sketch_")), key=lambda c: int(c.split("_")[1]))
    if not columns:
        return np.full((len(run_ids), 1), np.nan)
    first = steps_of(steps[steps["step"] == 1], run_ids)
    return step_stack(first, run_ids, columns)[:, 0, :]


def _difference(parallel: bool, scale: float, cos: float, heavier: str | None) -> str:
    if not np.isfinite(cos):
        return "not measured (no gradient sketch)"
    if parallel:
        return f"weighs tokens alike (×{factor_label(scale)})"
    return f"{heavier or 'other tokens'} more (cos {cos:.4f})"


def paper_table(layouts: pd.DataFrame, runs: pd.DataFrame, steps: pd.DataFrame, tol: Tolerances) -> pd.DataFrame:
    """One row per (mode, paper) of a family, both at W=1 grad_accum=1 (empty: no paper's objective ran).

    `layouts` is `analysis.post_training.layouts.layout_table`'s: each mode's baseline is its W=1 run."""
    paper_of = runs.set_index("run")["paper"]
    at_one = layouts[(layouts["verdict"] == "reference")].copy()
    at_one["paper"] = at_one["run"].map(paper_of)
    papers = at_one[at_one["paper"].notna()]
    if papers.empty:
        return pd.DataFrame(columns=COLUMNS)
    pairs = at_one.merge(papers, on="family", suffixes=("", "_p"))
    pairs = pairs[pairs["run"] != pairs["run_p"]].reset_index(drop=True)
    if pairs.empty:
        return pd.DataFrame(columns=COLUMNS)
    ids = pd.Series(pd.unique(pd.concat([pairs["run"], pairs["run_p"]])))
    every = step1_sketches(steps, ids)
    position = pd.Series(range(len(ids)), index=ids)
    sketch, paper_sketch = every[position[pairs["run"]].to_numpy()], every[position[pairs["run_p"]].to_numpy()]
    dot = (sketch * paper_sketch).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = dot / (np.linalg.norm(sketch, axis=-1) * np.linalg.norm(paper_sketch, axis=-1))
        scale = dot / (paper_sketch**2).sum(-1)
    out = pd.DataFrame({"family": pairs["family"], "reduction": pairs["reduction"], "name": pairs["name"]})
    out["paper"], out["paper_name"] = pairs["paper_p"], pairs["name_p"]
    out["weighs"], out["paper_weighs"] = pairs["weighs"], pairs["weighs_p"]
    out["scale"], out["cos"] = scale, cos
    out["parallel"] = np.abs(1 - cos) <= tol.cos_tol
    known = out["weighs"].notna() & out["paper_weighs"].notna()
    out["heavier"] = [
        heavier_tokens(a, b) if ok else None for a, b, ok in zip(out["weighs"], out["paper_weighs"], known)
    ]
    out["difference"] = [_difference(*v) for v in zip(out["parallel"], scale, cos, out["heavier"])]
    declared_same = out["weighs"] == out["paper_weighs"]
    as_declared = (out["parallel"] == declared_same).astype(object).where(known & np.isfinite(cos), pd.NA)
    out["as_declared"] = pd.array(as_declared, dtype="boolean")
    return out[COLUMNS]
