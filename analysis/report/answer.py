"""report.md's answer: what each mode does, in plain words generated from the numbers (its other sections: `document.py`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.gradients.expected import SAME
from analysis.gradients.groups import data_ranks
from analysis.load.sweeps import NOT_RUN
from analysis.report.communication import calls_clause
from analysis.report.cost import interleaved_clause
from analysis.report.invariance import invariance_sentence
from analysis.report.markdown import count, listed, names, span
from analysis.report.trainers import trainers_answer
from analysis.trainers.table import is_trainer
from runner.modes import OVER_W, label_order, modes_where, with_extra_collectives

# Verdicts of runs that were not compared with a baseline.
NOT_COMPARED = ("reference", "no reference", "failed", "not run")


def _departure(rows: pd.DataFrame) -> str:
    """Where these runs' loss curves leave the baseline's tolerance ("departs from step 12"), in words that
    hold when some or none of them do."""
    steps = rows["first_step_beyond"].dropna()
    if steps.empty:
        return "stays within tolerance of the baseline's"
    where = f"departs from step {span(steps, '.0f')}"
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
        f" (clipping active in {span(deviating['baseline_clip_frac'] * 100, '.0f')}% of the baseline's steps, "
        f"{span(deviating['clip_active_frac'] * 100, '.0f')}% of its own)"
        if clipped
        else " (no clipping)"
    )
    return f"{curve} {_departure(deviating)} and ends {span(deviating['final_loss_diff'], '+.3g')} from the baseline{clipping}"


def _mode_sentence(mode: str, rows: pd.DataFrame) -> str:
    """One bullet: what `mode` does to the gradient and the loss curve, with the numbers."""
    compared = rows[~rows["verdict"].isin(["reference", "no reference"]) & ~rows["status"].isin(NOT_RUN)]
    unreferenced = (rows["verdict"] == "no reference").sum()
    if compared.empty:
        if unreferenced:
            return f"- `{mode}`: not compared in {count(unreferenced, 'run')}: no completed `sum` run to compare with."
        return f"- `{mode}`: the reference of every group it ran in." if (rows["verdict"] == "reference").any() else ""
    counts = compared["verdict"].value_counts()
    parts = []
    same = compared[compared["verdict"].isin(SAME)]
    if len(same):
        worlds = ", ".join(f"W={w:g}" for w in sorted(data_ranks(same).unique()))
        parts.append(
            f"the baseline's gradient in {len(same)}/{len(compared)} runs ({worlds}; step-1 scale "
            f"{span(same['factor'], '.6f')}, max loss difference {span(same['loss_max_abs_diff'], '.2g')})"
        )
    rescaled = compared[compared["verdict"] == "rescaled"]
    if len(rescaled):
        by_world = rescaled.groupby(data_ranks(rescaled))["factor_label"].agg(lambda s: "/".join(sorted(set(s))))
        factors = ", ".join(f"×{label} at W={w:g}" for w, label in by_world.items())
        is_one_over_w = np.allclose(rescaled["factor"] * data_ranks(rescaled), 1, rtol=1e-3)
        several = rescaled["optimizer"].nunique() > 1
        curves = [
            _curve_clause(runs_of, optimizer if several else "") for optimizer, runs_of in rescaled.groupby("optimizer")
        ]
        parts.append(
            f"the same direction (step-1 cosine {span(rescaled['sketch_cos_step1'], '.6f')}) scaled by {factors}"
            + (" (= 1/W)" if is_one_over_w else "")
            + f" in {len(rescaled)}/{len(compared)} runs; "
            + "; ".join(curves)
        )
    different = compared[compared["verdict"] == "different"]
    if len(different):
        parts.append(
            f"a different gradient in {len(different)}/{len(compared)} runs (step-1 cosine "
            f"{span(different['sketch_cos_step1'], '.4f')}, grad-norm ratio {span(different['grad_norm_ratio_step1'], '.3f')}); "
            f"its loss curve {_departure(different)}, "
            f"apart by up to {different['loss_max_abs_diff'].max():.3g}"
        )
    if counts.get("failed", 0):
        failed = compared[compared["verdict"] == "failed"]
        parts.append(f"failed in {count(len(failed), 'run')} ({'; '.join(failed['reason'].head(3))})")
    if unreferenced:
        parts.append(f"not compared in {count(unreferenced, 'run')} (no completed `sum` run in its group)")
    return f"- `{mode}`: " + "; ".join(parts) + "."


def _conclusion(verdicts: pd.DataFrame) -> str:
    """The question's answer, stated only when the verdicts carry it."""
    # Over the runs that completed and were compared: a failed run says nothing about the math.
    compared = verdicts[~verdicts["verdict"].isin(["reference", "no reference", "failed", "not run"])]
    multi = compared[data_ranks(compared) > 1]

    def all_are(modes: list[str], test) -> bool:
        rows = multi[multi["reduction"].isin(modes)]
        return len(rows) > 0 and bool(test(rows).all())

    ran = set(multi["reduction"])  # name only the modes these runs hold
    over_w = [m for m in modes_where(gradient=OVER_W) if m in ran]
    correct = [m for m in modes_where(role="correct alternative") if m in ran]
    without = all_are(
        over_w, lambda r: (r["verdict"] == "rescaled") & np.isclose(r["factor"] * data_ranks(r), 1, rtol=1e-3)
    )
    alternatives = all_are(correct, lambda r: r["verdict"].isin(SAME))
    if not without:
        return ""
    text = (
        "So the differentiable all-reduce is needed for the gradient's *scale*, not its direction: "
        f"without it ({names(over_w)}) every gradient is the true one divided by W."
    )
    for optimizer, rescaled in multi[multi["reduction"].isin(over_w)].groupby("optimizer"):
        if rescaled["loss_matches"].all():
            text += f" Under {optimizer} the optimizer hides that scale: their loss curves match the reference's."
        else:
            departing = rescaled[~rescaled["loss_matches"]]
            text += (
                f" Under {optimizer} it changes training: in {len(departing)}/{len(rescaled)} of their runs the loss "
                f"curve departs from the reference's (from step {span(departing['first_step_beyond'], '.0f')})."
            )
    if alternatives:  # what each issues is read from the modes' facts, not assumed of an alternative
        extra = set(with_extra_collectives())
        lean, heavier = [m for m in correct if m not in extra], [m for m in correct if m in extra]
        if lean:
            text += (
                f" {listed([f'`{m}`' for m in lean])} {'recovers' if len(lean) == 1 else 'recover'} the true gradient "
                "exactly with `local`'s collectives (none per micro-batch)."
            )
        if heavier:
            text += f" {listed([f'`{m}`' for m in heavier])} {'recovers' if len(heavier) == 1 else 'recover'} it too."
    return text


def _cost_sentence(comm: pd.DataFrame, cost: pd.DataFrame) -> str:
    calls = calls_clause(comm)
    if cost is None or cost.empty:
        if not calls:
            return ""
        return (
            f"Cost: {calls}. Their time cost is not measured here: step times of jobs run one after another "
            'differ by machine load as much as by mode ("Cost, measured interleaved" below says how to measure it).'
        )
    clauses = [interleaved_clause(job) for _, job in cost.groupby("job", sort=False)]
    return "Cost: " + (calls + ". Time, " if calls else "time, ") + " Also, ".join(clauses) + "."


def _gradient_phrase(rows: pd.DataFrame) -> str:
    """What one mode's compared runs give against their baseline, in a few words; "" when the runs disagree."""
    verdicts = rows["verdict"]
    same, rescaled = verdicts.isin(SAME), verdicts == "rescaled"
    if same.all():
        return "the baseline's gradient"
    if (verdicts == "different").all():
        return "a different gradient"
    if not (same | rescaled).all():
        return ""
    over_w = np.isclose(rows["factor"] * data_ranks(rows), 1, rtol=1e-3)
    shown = rows[rescaled]
    by_world = shown.groupby(data_ranks(shown))["factor_label"].agg(lambda s: "/".join(sorted(set(s))))
    factors = ", ".join(f"×{label} at W={w:g}" for w, label in by_world.items())
    if over_w.all():  # equivalent at W=1, rescaled by 1/W elsewhere
        return f"the baseline's gradient divided by W ({factors})"
    if rescaled.all():
        return f"the baseline's gradient {factors}"
    return ""


def headline(verdicts: pd.DataFrame, trainers: pd.DataFrame | None = None) -> str:
    """The answer in one sentence: which modes give the baseline's gradient, which a multiple of it and which
    another one, over the runs compared with a baseline; the trainers' answer (`trainers_answer`) after it, or
    alone where only trainers' rules were compared."""
    with_trainers = trainers is not None and is_trainer(trainers["reduction"]).any()
    compared = verdicts[~verdicts["verdict"].isin(NOT_COMPARED) & ~is_trainer(verdicts["reduction"])]
    if compared.empty:
        if with_trainers:
            return trainers_answer(trainers)
        rules = verdicts[~verdicts["verdict"].isin(NOT_COMPARED) & is_trainer(verdicts["reduction"])]
        if len(rules):  # a known bug's arms, or rules of the user's own, beside their reference
            return (
                f"Of the runner's own modes only the reference ran here; {count(len(rules), 'run')} of other rules "
                f"({listed([f'`{label}`' for label in sorted(set(rules['reduction']))])}) "
                f"{'was' if len(rules) == 1 else 'were'} compared with it (below)."
            )
        return "No run here could be compared with a baseline (the verdicts below say why)."
    phrases: dict[str, list[str]] = {}
    for mode in sorted(set(compared["reduction"]), key=label_order):
        phrase = _gradient_phrase(compared[compared["reduction"] == mode])
        phrases.setdefault(phrase or "one gradient in some runs and another in others", []).append(mode)
    clauses = [
        f"{listed([f'`{m}`' for m in modes])} {'gives' if len(modes) == 1 else 'give'} {phrase}"
        for phrase, modes in phrases.items()
    ]
    return "; ".join(clauses) + "." + (f" {trainers_answer(trainers)}" if with_trainers else "")


def _tensor_parallel_note(runs: pd.DataFrame) -> str:
    """What W counts where a run is tensor- or pipeline-parallel ("" where none is)."""
    tensor = (runs.get("tp", pd.Series(1, index=runs.index)) > 1).any()
    pipeline = (runs.get("pp", pd.Series(1, index=runs.index)) > 1).any()
    if not pipeline:
        if not tensor:
            return ""
        return (
            " W below counts the data ranks, world_size / tp: the tp ranks of a tensor-parallel group hold the same "
            "tokens, so the loss and its token count are reduced over the data ranks alone."
        )
    holders = (
        "the tp ranks of a tensor-parallel group and the pp stages of a pipeline"
        if tensor
        else "the pp stages of a pipeline"
    )
    over = "(tp x pp)" if tensor else "pp"
    return (
        f" W below counts the data ranks, world_size / {over}: {holders} hold the same tokens (the last stage "
        "the loss), so the loss and its token count are reduced over the data ranks alone."
    )


def opening(
    runs: pd.DataFrame,
    verdicts: pd.DataFrame,
    comm: pd.DataFrame,
    invariance_summary: pd.DataFrame,
    cost: pd.DataFrame | None = None,
    trainers: pd.DataFrame | None = None,
) -> str:
    """The report's first section: the answer in one sentence, then the numbers."""
    ran = runs[~runs["status"].isin(NOT_RUN) & runs["optim.name"].notna()]
    optimizers = ", ".join(sorted(ran["optimizer"].unique()))
    lines = [
        "## Answer",
        "",
        headline(verdicts, trainers),
        "",
        f"{count(len(runs), 'run')} in {count(runs['group'].nunique(), 'group')} ({(runs['status'] == 'completed').sum()} completed); "
        f"optimizer {optimizers or 'n/a'}; layouts {', '.join(sorted(ran['layout'].unique())) or 'n/a'}. "
        "Each run is compared with its baseline (the world_size=1 `sum` run where the sweep has one, else its group's `sum`)."
        + _tensor_parallel_note(runs),
        "",
    ]
    shown = verdicts["reduction"][~is_trainer(verdicts["reduction"])]  # a trainer has its own line (report/trainers.py)
    for mode in sorted(set(shown), key=label_order):
        sentence = _mode_sentence(mode, verdicts[verdicts["reduction"] == mode])
        if sentence:
            lines.append(sentence)
    for extra in (_conclusion(verdicts), invariance_sentence(invariance_summary), _cost_sentence(comm, cost)):
        if extra:
            lines += ["", extra]
    return "\n".join(lines) + "\n"
