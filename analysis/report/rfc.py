"""The report's answer to the RFC (xtuner RFC #1335: "do we really need the all_reduce in the loss context?"),
point by point, from the runs: each point opens with its answer (yes or no, or "Not measured here" with
what would show it), then the numbers.

1. FSDP trains with the local loss, but its gradient is grad L / W: the runs that backpropagate a rank's
   own S_rsm / N under FSDP's mean with no all-reduce in the graph (`local`, `detached`, xtuner as the RFC
   proposes) measure a step-1 scale of 1/W against the reference.
2. The all-reduce's backward decides whether it is needed. With a SUM backward (funcol, and
   `torch.distributed.nn.functional.all_reduce`, which xtuner imports; each run measures it at its start)
   each rank's loss receives W and FSDP's mean gives grad L back: drop it and the gradient is grad L / W.
   With an identity backward (Megatron's region reduction, what the RFC's author assumed) it changes
   nothing: the gradient is grad L / W, as `local`'s. Trainers that get grad L without it: FSDP SUM, or W x
   loss under FSDP's mean; a SUM backward under FSDP SUM gives W x grad L.
3. xtuner's TrainEngine averages the logged loss over the ranks outside autograd: logging only, no
   second reduction of the gradient. Without the CE all-reduce that mean logs L / W (the runs' reported
   loss over L), so a trainer that drops it must change its logging too.

Only what the runs show is stated (completed, compared, W > 1), with their numbers, and only from runs that
answer the RFC's question: the runner's own modes and the trainers' rules (the presets', or a user's). A known
bug's arms are left out: upstream code before a fix, whose factor can look like the local loss's without being
it (Ulysses SP's division by sp gives 1/W at W = sp).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.gradients.expected import SAME
from analysis.gradients.groups import data_ranks
from analysis.report.markdown import listed, span
from runner.modes import label_order

QUESTIONS = (
    "Can FSDP train with the local loss alone?",
    "Is the loss's differentiable all-reduce needed for grad L?",
    "Is the engine's mean of the logged loss a second reduction of the gradient?",
)


def _names(labels) -> str:
    return listed([f"`{label}`" for label in sorted(set(labels), key=label_order)])


def _over_w(rows: pd.DataFrame, column: str = "factor") -> pd.Series:
    return np.isclose(rows[column] * data_ranks(rows), 1, rtol=1e-3)


def _by_world(rows: pd.DataFrame, column: str = "factor") -> str:
    """'×0.500000 at W=2, ×0.250000 at W=4' of a column, per world size."""
    return ", ".join(f"×{span(r[column], '.6f')} at W={w:g}" for w, r in rows.groupby(data_ranks(rows)))


def _measured_backward(rows: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The runs whose graph's all-reduce measured a SUM (W) or an identity (1) backward at W > 1."""
    factor = rows["backward_factor"]
    target = data_ranks(rows) if kind == "SUM" else 1.0
    return rows[factor.notna() & np.isclose(factor, target) & (data_ranks(rows) > 1)]


def _without_all_reduce(rows: pd.DataFrame) -> pd.Series:
    """No differentiable all-reduce in the graph: no built-in mode that has one, none measured."""
    return rows["all_reduce"].eq("") & rows["backward_factor"].isna()


def _point_local(compared: pd.DataFrame) -> str:
    local = compared[_without_all_reduce(compared) & (compared["verdict"] == "rescaled") & _over_w(compared)]
    local = local[local["fsdp_reduction"] == "mean"]
    if local.empty:
        return (
            f"{QUESTIONS[0]} Not measured here: no run backpropagates its local loss under FSDP's mean at W > 1 "
            "(`local`, or xtuner as the RFC proposes, `trainer=xtuner_rfc`)."
        )
    return (
        f"{QUESTIONS[0]} Yes, but its gradient is grad L / W, not grad L: {_names(local['reduction'])} "
        f"(no all-reduce in the graph, FSDP's mean) measure a step-1 scale of {_by_world(local)} (= 1/W) against "
        "the reference."
    )


def _point_all_reduce(compared: pd.DataFrame, table: pd.DataFrame) -> str:
    multi = table[(data_ranks(table) > 1) & ~table["verdict"].isin(["no reference", "failed", "not run"])]
    sum_backward, identity = _measured_backward(multi, "SUM"), _measured_backward(multi, "identity")
    true = multi["verdict"].isin(["reference", *SAME])
    needs = sum_backward[true.reindex(sum_backward.index) & (sum_backward["fsdp_reduction"] == "mean")]
    dropped = compared[_without_all_reduce(compared) & (compared["verdict"] == "rescaled") & _over_w(compared)]
    if needs.empty and identity.empty:
        reference = multi[multi["verdict"] == "reference"]
        if len(reference) and len(dropped):  # records of a runner that did not measure the backward
            return (
                f"{QUESTIONS[1]} Yes, under FSDP's mean with the reference's all-reduce (`sum`, funcol; its backward "
                f"not measured in these records): `sum` gets grad L, and without it the gradient is grad L / W "
                f"({_names(dropped['reduction'])}: {_by_world(dropped)})."
            )
        return (
            f"{QUESTIONS[1]} Not measured here: no run measured its all-reduce's backward at W > 1 (summary.json's "
            "`all_reduce_backward`, recorded by runs with an all-reduce in the graph)."
        )
    torch = ", ".join(sorted(set(pd.concat([sum_backward, identity])["backward_torch"].dropna().astype(str))))
    clauses = []
    if len(needs):
        clauses.append(
            f"Yes, where its backward is a SUM and FSDP takes the mean: measured with torch {torch}, the backward "
            f"gives each rank's loss ×{span(needs['backward_factor'], 'g')} (= W) in {_names(needs['reduction'])}, "
            "whose gradient is grad L"
            + (f"; without it the gradient is grad L / W ({_names(dropped['reduction'])})" if len(dropped) else "")
        )
    if len(identity):
        as_local = identity[(identity["verdict"] == "rescaled") & _over_w(identity)]
        clauses.append(
            ("No" if not clauses else "no")
            + f" with an identity backward (×1 measured in {_names(identity['reduction'])}): it changes nothing, "
            + (
                f"the gradient is grad L / W (step-1 scale {_by_world(as_local)}), as without it"
                if len(as_local) == len(identity)
                else f"the gradient is {', '.join(sorted(set(identity['verdict_text'])))}"
            )
        )
    wrong = sum_backward[(sum_backward["fsdp_reduction"] == "sum") & np.isclose(
        sum_backward["factor"], data_ranks(sum_backward), rtol=1e-3
    )]  # fmt: skip
    if len(wrong):
        clauses.append(f"kept under FSDP SUM it gives W x grad L ({_names(wrong['reduction'])}: {_by_world(wrong)})")
    text = f"{QUESTIONS[1]} " + "; ".join(clauses) + "."
    correct = compared[compared["verdict"].isin(SAME) & _without_all_reduce(compared)]
    by_fsdp = {
        "FSDP SUM": correct.loc[correct["fsdp_reduction"] == "sum", "reduction"],
        "W x loss under FSDP's mean": correct.loc[correct["fsdp_reduction"] == "mean", "reduction"],
    }
    replacements = [f"{how} ({_names(labels)})" for how, labels in by_fsdp.items() if len(labels)]
    if len(needs):
        text += f" Which trainers need it: those whose rule has it in the graph under FSDP's mean ({_names(needs['reduction'])})"
        text += "; the others get grad L without it, by " + " or by ".join(replacements) + "." if replacements else "."
    elif replacements:
        text += " Grad L without it: " + " or ".join(replacements) + "."
    return text


def _point_logging(compared: pd.DataFrame) -> str:
    if "reported_loss_ratio_median" not in compared:
        return ""
    ratio = compared["reported_loss_ratio_median"]
    logs_local_mean = compared[ratio.notna() & _over_w(compared, "reported_loss_ratio_median")]
    if logs_local_mean.empty:
        return (
            f"{QUESTIONS[2]} Not measured here: no run logs the ranks' mean of a local loss (xtuner's engine "
            "without the CE all-reduce, `trainer=xtuner_rfc`)."
        )
    gradient = logs_local_mean[logs_local_mean["verdict"] == "rescaled"]
    text = (
        f"{QUESTIONS[2]} No, it is logging only: it averages, outside autograd, a value that is the same on every "
        f"rank once the loss is all-reduced. Without the CE all-reduce it logs L / W: {_names(logs_local_mean['reduction'])} "
        f"report L {_by_world(logs_local_mean, 'reported_loss_ratio_median')} (= 1/W; reported loss over L, median "
        "over steps)"
    )
    if len(gradient):
        text += f", while the gradient is scaled once, not twice ({_by_world(gradient)}, as `local`'s)"
    return text + ". A trainer that drops the CE all-reduce must change its logging too."


def answers_the_rfc(runs: pd.DataFrame) -> pd.Series:
    """Whether each run may answer the RFC: a runner mode or a trainer's rule, not a known bug's arm."""
    missing = pd.Series(None, index=runs.index, dtype=object)
    return ~(runs.get("known_bug.name", missing).notna() & runs.get("custom.fn", missing).notna())


def rfc_answer(table: pd.DataFrame, runs: pd.DataFrame) -> str:
    """The three points (empty when the runs show none of them: no run at W > 1 that answers the RFC was
    compared). `table` is the verdicts table, a row per run of `runs`."""
    table = table[table["run"].isin(runs.loc[answers_the_rfc(runs), "run"])]
    compared = table[
        ~table["verdict"].isin(["reference", "no reference", "failed", "not run"]) & (data_ranks(table) > 1)
    ]
    if compared.empty:
        return ""
    if "backward_factor" not in compared:
        table, compared = (frame.assign(backward_factor=np.nan, backward_torch=None) for frame in (table, compared))
    points = [_point_local(compared), _point_all_reduce(compared, table), _point_logging(compared)]
    return "**The RFC** (is the loss's differentiable all-reduce needed?), point by point:\n\n" + "\n".join(
        f"{i}. {point}" for i, point in enumerate(points, 1) if point
    )
