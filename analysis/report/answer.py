"""report.md's answer: what each mode does, in plain words generated from the numbers (its other sections: `document.py`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.gradients.expected import SAME
from analysis.load.sweeps import NOT_RUN
from analysis.report.cost import interleaved_clause
from analysis.trainers.table import is_trainer
from runner.modes import OVER_W, label_order, modes_where, with_extra_collectives


def _range(values: pd.Series, fmt: str) -> str:
    values = values.dropna()
    if values.empty:
        return "n/a"
    low, high = values.min(), values.max()
    return format(low, fmt) if format(low, fmt) == format(high, fmt) else f"{format(low, fmt)} to {format(high, fmt)}"


def _names(modes: list[str]) -> str:
    return ", ".join(f"`{m}`" for m in modes)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _departure(rows: pd.DataFrame) -> str:
    """Where these runs' loss curves leave the baseline's tolerance ("departs from step 12"), in words that
    hold when some or none of them do."""
    steps = rows["first_step_beyond"].dropna()
    if steps.empty:
        return "stays within tolerance of the baseline's"
    where = f"departs from step {_range(steps, '.0f')}"
    return where if len(steps) == len(rows) else f"{where} in {len(steps)}/{len(rows)} runs"


def _curve_clause(rescaled: pd.DataFrame, optimizer: str) -> str:
    """Whether rescaled runs' loss curves still match the baseline's (under `optimizer`, when named)."""
    under = f"under {optimizer}, " if optimizer else ""
    matching = rescaled["loss_matches"].sum()
    deviating = rescaled[~rescaled["loss_matches"]]
    if not len(deviating):
        return f"{under}its loss curve still matches the baseline's"
    curve = (
        f"{under}its loss curve matches in {matching}/{len(rescaled)}; elsewhere it"
        if matching
        else f"{under}its loss curve"
    )
    clipped = (
        deviating["baseline_clip_frac"].fillna(0).gt(0).any() or deviating["clip_active_frac"].fillna(0).gt(0).any()
    )
    clipping = (
        f" (clipping active in {_range(deviating['baseline_clip_frac'] * 100, '.0f')}% of the baseline's steps, "
        f"{_range(deviating['clip_active_frac'] * 100, '.0f')}% of its own)"
        if clipped
        else " (no clipping)"
    )
    return f"{curve} {_departure(deviating)} and ends {_range(deviating['final_loss_diff'], '+.3g')} from the baseline{clipping}"


def _mode_sentence(mode: str, rows: pd.DataFrame) -> str:
    """One bullet: what `mode` does to the gradient and the loss curve, with the numbers."""
    compared = rows[~rows["verdict"].isin(["reference", "no reference"]) & ~rows["status"].isin(NOT_RUN)]
    unreferenced = (rows["verdict"] == "no reference").sum()
    if compared.empty:
        if unreferenced:
            return f"- `{mode}`: not compared in {_count(unreferenced, 'run')}: no completed `sum` run to compare with."
        return f"- `{mode}`: the reference of every group it ran in." if (rows["verdict"] == "reference").any() else ""
    counts = compared["verdict"].value_counts()
    parts = []
    same = compared[compared["verdict"].isin(SAME)]
    if len(same):
        worlds = ", ".join(f"W={w}" for w in sorted(same["world_size"].unique()))
        parts.append(
            f"the baseline's gradient in {len(same)}/{len(compared)} runs ({worlds}; step-1 scale "
            f"{_range(same['factor'], '.6f')}, max loss difference {_range(same['loss_max_abs_diff'], '.2g')})"
        )
    rescaled = compared[compared["verdict"] == "rescaled"]
    if len(rescaled):
        by_world = rescaled.groupby("world_size")["factor_label"].agg(lambda s: "/".join(sorted(set(s))))
        factors = ", ".join(f"×{label} at W={w}" for w, label in by_world.items())
        is_one_over_w = np.allclose(rescaled["factor"] * rescaled["world_size"], 1, rtol=1e-3)
        several = rescaled["optimizer"].nunique() > 1
        curves = [
            _curve_clause(runs_of, optimizer if several else "") for optimizer, runs_of in rescaled.groupby("optimizer")
        ]
        parts.append(
            f"the same direction (step-1 cosine {_range(rescaled['sketch_cos_step1'], '.6f')}) scaled by {factors}"
            + (" (= 1/W)" if is_one_over_w else "")
            + f" in {len(rescaled)}/{len(compared)} runs; "
            + "; ".join(curves)
        )
    different = compared[compared["verdict"] == "different"]
    if len(different):
        parts.append(
            f"a different gradient in {len(different)}/{len(compared)} runs (step-1 cosine "
            f"{_range(different['sketch_cos_step1'], '.4f')}, grad-norm ratio {_range(different['grad_norm_ratio_step1'], '.3f')}); "
            f"its loss curve {_departure(different)}, "
            f"apart by up to {different['loss_max_abs_diff'].max():.3g}"
        )
    if counts.get("failed", 0):
        failed = compared[compared["verdict"] == "failed"]
        parts.append(f"failed in {_count(len(failed), 'run')} ({'; '.join(failed['reason'].head(3))})")
    if unreferenced:
        parts.append(f"not compared in {_count(unreferenced, 'run')} (no completed `sum` run in its group)")
    return f"- `{mode}`: " + "; ".join(parts) + "."


def _conclusion(verdicts: pd.DataFrame) -> str:
    """The question's answer, stated only when the verdicts carry it."""
    # Over the runs that completed and were compared: a failed run says nothing about the math.
    compared = verdicts[~verdicts["verdict"].isin(["reference", "no reference", "failed", "not run"])]
    multi = compared[compared["world_size"] > 1]

    def all_are(modes: list[str], test) -> bool:
        rows = multi[multi["reduction"].isin(modes)]
        return len(rows) > 0 and bool(test(rows).all())

    ran = set(multi["reduction"])  # name only the modes these runs hold
    over_w = [m for m in modes_where(gradient=OVER_W) if m in ran]
    correct = [m for m in modes_where(role="correct alternative") if m in ran]
    without = all_are(
        over_w, lambda r: (r["verdict"] == "rescaled") & np.isclose(r["factor"] * r["world_size"], 1, rtol=1e-3)
    )
    alternatives = all_are(correct, lambda r: r["verdict"].isin(SAME))
    if not without:
        return ""
    text = (
        "So the differentiable all-reduce is needed for the gradient's *scale*, not its direction: "
        f"without it ({_names(over_w)}) every gradient is the true one divided by W."
    )
    for optimizer, rescaled in multi[multi["reduction"].isin(over_w)].groupby("optimizer"):
        if rescaled["loss_matches"].all():
            text += f" Under {optimizer} the optimizer hides that scale: their loss curves match the reference's."
        else:
            departing = rescaled[~rescaled["loss_matches"]]
            text += (
                f" Under {optimizer} it changes training: in {len(departing)}/{len(rescaled)} of their runs the loss "
                f"curve departs from the reference's (from step {_range(departing['first_step_beyond'], '.0f')})."
            )
    if alternatives:
        text += f" {' and '.join(f'`{m}`' for m in correct)} recover the true gradient exactly with no per-micro-batch collective."
    return text


def _calls_clause(comm: pd.DataFrame) -> str:
    """How many more loss all-reduces per step `sum` and `detached` issue than `local` (exact counts)."""
    parts = []
    for mode in with_extra_collectives():
        calls = comm.loc[comm["reduction"] == mode, "extra_loss_calls_vs_local"].dropna()
        if len(calls):
            parts.append(
                f"`{mode}` issues {_range(calls, '.0f')} more loss all-reduce{'' if calls.max() == 1 else 's'} per step than `local`"
                if (calls != 0).any()
                else f"`{mode}` as many loss all-reduces per step as `local`"
            )
    return "; ".join(parts)


def _cost_sentence(comm: pd.DataFrame, cost: pd.DataFrame) -> str:
    calls = _calls_clause(comm)
    if cost is None or cost.empty:
        if not calls:
            return ""
        return (
            f"Cost: {calls}. Their time cost is not measured here: step times of jobs run one after another "
            'differ by machine load as much as by mode ("Cost, measured interleaved" below says how to measure it).'
        )
    clauses = [interleaved_clause(job) for _, job in cost.groupby("job", sort=False)]
    return "Cost: " + (calls + ". Time, " if calls else "time, ") + " Also, ".join(clauses) + "."


def _invariance_sentence(summary: pd.DataFrame) -> str:
    if summary.empty:
        return ""
    invariant = summary[summary["invariant"]]["reduction"].unique().tolist()
    changing = summary[~summary["invariant"]]
    parts = []
    if invariant:
        parts.append(", ".join(f"`{m}`" for m in invariant) + " give the same loss curve for every layout tried")
    for axes, rows in changing.groupby("changes_with"):
        modes = rows["reduction"].unique()
        verb = "changes" if len(modes) == 1 else "change"
        parts.append(", ".join(f"`{m}`" for m in modes) + f" {verb} with {axes.replace(', ', ' and ')}")
    return "Layouts at a fixed global batch: " + "; ".join(parts) + "."


def opening(
    runs: pd.DataFrame,
    verdicts: pd.DataFrame,
    comm: pd.DataFrame,
    invariance_summary: pd.DataFrame,
    cost: pd.DataFrame | None = None,
) -> str:
    """The report's first section: the answer, from the numbers."""
    ran = runs[~runs["status"].isin(NOT_RUN) & runs["optim.name"].notna()]
    optimizers = ", ".join(sorted(ran["optimizer"].unique()))
    lines = [
        "## Answer",
        "",
        f"{_count(len(runs), 'run')} in {_count(runs['group'].nunique(), 'group')} ({(runs['status'] == 'completed').sum()} completed); "
        f"optimizer {optimizers or 'n/a'}; layouts {', '.join(sorted(ran['layout'].unique())) or 'n/a'}. "
        "Each run is compared with its baseline (the world_size=1 `sum` run where the sweep has one, else its group's `sum`).",
        "",
    ]
    shown = verdicts["reduction"][~is_trainer(verdicts["reduction"])]  # a trainer has its own line (report/trainers.py)
    for mode in sorted(set(shown), key=label_order):
        sentence = _mode_sentence(mode, verdicts[verdicts["reduction"] == mode])
        if sentence:
            lines.append(sentence)
    for extra in (_conclusion(verdicts), _invariance_sentence(invariance_summary), _cost_sentence(comm, cost)):
        if extra:
            lines += ["", extra]
    return "\n".join(lines) + "\n"
