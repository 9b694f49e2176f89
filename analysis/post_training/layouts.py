"""Each post-training run against the same mode at W=1 grad_accum=1: is its gradient invariant to the layout?

Every layout trains on the same step (tokens, responses and advantages are drawn from the seed and the step
alone), so a mode whose gradient does not depend on the layout gives, at step 1, the gradient of its own run at
one process. The comparison is the verdicts' (`analysis.gradients`): the step-1 gradient sketches give the scale
k (s_r ~ k s_b) and the direction (their cosine), the loss curves whether the runs stay together; only the
baseline is the mode's own W=1 grad_accum=1 run (sp=1) instead of the reference.

`changes_with` names the axes in which the layout differs from that baseline (dp = world_size / sp, sp,
grad_accum); the expectation is `analysis.post_training.expectations`'.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.gradients.measures import measure
from analysis.gradients.tolerances import Tolerances
from analysis.gradients.verdicts import factor_label, verdicts
from analysis.post_training.expectations import EITHER, expected_change, is_post_training, stated_layouts, weighs

AXES = ("dp", "sp", "grad_accum")
SAME = {"identical", "equivalent"}
COLUMNS = [
    "run",
    "family",
    "reduction",
    "name",
    "layout",
    "dp",
    "sp",
    "grad_accum",
    "axes",
    "status",
    "baseline",
    "weighs",
    "scale",
    "cos",
    "verdict",
    "change",
    "expect_layouts",
    "expected",
    "as_expected",
    "reason",
]


def steps_of(steps: pd.DataFrame, run_ids: pd.Series) -> pd.DataFrame:
    """The steps of `run_ids` alone, their `run` categories those runs' (the [run, step] arrays take a subset)."""
    kept = steps[steps["run"].isin(run_ids)]
    run = kept["run"]
    return kept.assign(run=run.cat.remove_unused_categories() if isinstance(run.dtype, pd.CategoricalDtype) else run)


def display_name(runs: pd.DataFrame) -> pd.Series:
    """The name people know a mode by: `custom.name` for a custom rule, the mode's label otherwise."""
    name = runs.get("custom.name", pd.Series(None, index=runs.index))
    return name.where(name.map(lambda v: isinstance(v, str) and bool(v)), runs["reduction"]).astype(str)


def _mode_baselines(runs: pd.DataFrame) -> pd.Series:
    """Each run's baseline: the completed run of its family and mode at world_size=1, grad_accum=1 (NaN: none)."""
    one = runs[(runs["status"] == "completed") & (runs["world_size"] == 1) & (runs["grad_accum"] == 1)]
    first = one.drop_duplicates(["family", "reduction"]).set_index(["family", "reduction"])["run"]
    keys = pd.MultiIndex.from_frame(runs[["family", "reduction"]])
    return pd.Series(first.reindex(keys).to_numpy(), index=runs.index, dtype=object)


def _job_number(job: str) -> float:
    """A Hydra job's number (its folder `<n>_...`): the modes in the order the sweep lists them."""
    head = str(job).split("_", 1)[0]
    return float(head) if head.isdigit() else float("inf")


def _axes(dp: int, sp: int, grad_accum: int) -> str:
    """The axes in which a layout differs from W=1 grad_accum=1."""
    return ", ".join(axis for axis, size in zip(AXES, (dp, sp, grad_accum)) if size > 1)


def _change(verdict: str, scale: float, cos: float, first_beyond: float) -> str:
    """What the layout did to the gradient, in words."""
    if verdict == "reference":
        return "the baseline (W=1, grad_accum=1)"
    if verdict in SAME:
        return "the same"
    if verdict == "rescaled":
        return f"×{factor_label(scale)}"
    if verdict == "different":
        if np.isfinite(cos) and cos < 1:
            return f"another direction (cos {cos:.4f})"
        return f"the same step-1 gradient, the loss curve departs from step {first_beyond:.0f}"
    return verdict


def _expected_text(expected) -> str:
    if expected is None:
        return "not judged (no custom.expect_layouts)"
    if expected == EITHER:
        return "the same or another direction (responses of one length)"
    if expected == "different":
        return "another direction"
    return "the same" if expected == 1.0 else f"×{factor_label(expected)}"


def _as_expected(expected, verdict: str, scale: float, tol: Tolerances):
    if verdict == "failed":
        return False
    if expected is None or verdict in ("reference", "not run", "no reference"):
        return pd.NA
    if expected == EITHER:
        return verdict in SAME | {"different"}
    if expected == "different":
        return verdict == "different"
    if abs(expected - 1) <= tol.scale_rtol:
        return verdict in SAME
    return verdict == "rescaled" and abs(scale / expected - 1) <= tol.scale_rtol


def layout_table(runs: pd.DataFrame, steps: pd.DataFrame, tol: Tolerances) -> pd.DataFrame:
    """One row per post-training run: its gradient against its mode's W=1 grad_accum=1 run (empty: no such runs).

    `runs` as `analysis.gradients.groups.assign_groups` returns them."""
    pg = runs[is_post_training(runs)]
    pg = pg.iloc[np.lexsort([pg["job"].map(_job_number), pg["sweep"].astype(str)])].reset_index(drop=True)
    if pg.empty:
        return pd.DataFrame(columns=COLUMNS)
    versus = pg.assign(baseline=_mode_baselines(pg))
    measures, _ = measure(versus, steps_of(steps, pg["run"]), tol)
    judged = verdicts(versus, measures, tol)
    out = pd.DataFrame({"run": pg["run"], "family": pg["family"], "reduction": pg["reduction"]})
    out["name"] = display_name(pg)
    out["layout"] = pg["layout"]
    out["dp"] = (pg["world_size"] // (pg["sp"] * pg["tp"] * pg["pp"])).astype(int)
    out["sp"], out["grad_accum"] = pg["sp"].astype(int), pg["grad_accum"].astype(int)
    out["axes"] = [_axes(*sizes) for sizes in zip(out["dp"], out["sp"], out["grad_accum"])]
    out["status"], out["baseline"] = pg["status"], versus["baseline"]
    out["weighs"] = [weighs(row) for _, row in pg.iterrows()]
    out["scale"] = judged["factor"]
    out["cos"] = measures["sketch_cos_step1"]
    out["verdict"] = judged["verdict"]
    out["change"] = [
        _change(*values)
        for values in zip(
            judged["verdict"], judged["factor"], measures["sketch_cos_step1"], measures["first_step_beyond"]
        )
    ]
    expected = [expected_change(row) for _, row in pg.iterrows()]
    out["expect_layouts"] = [stated_layouts(row) for _, row in pg.iterrows()]
    out["expected"] = [_expected_text(e) for e in expected]
    out["as_expected"] = pd.array(
        [_as_expected(e, v, k, tol) for e, v, k in zip(expected, judged["verdict"], judged["factor"])], dtype="boolean"
    )
    out["reason"] = np.where(
        versus["baseline"].isna() & ~judged["verdict"].isin(["failed", "not run"]),
        "no completed run of this mode at W=1, grad_accum=1 to compare with (sweep layout=w1 beside it)",
        judged["reason"],
    )
    return out[COLUMNS]
