"""The report's answer to the RFC ("do we really need the all_reduce in the loss context?"), from the runs.

Its two sides disagree about the backward of the differentiable all-reduce.
With a SUM backward (funcol, and `torch.distributed.nn.functional.all_reduce`,
which xtuner imports) each rank's loss gradient is multiplied by W, and FSDP's
mean brings it back to grad L: remove the collective and the gradient is
grad L / W. With an identity backward (Megatron's region reduction, what the
RFC's author assumed) the collective changes nothing: the gradient is already
grad L / W, as `local`'s. FSDP SUM, or W x loss under FSDP's mean, gives grad L
with no collective per micro-batch.

Each sentence is stated only where the sweep holds the runs that show it
(completed, compared, W > 1), with their numbers; a sweep without an identity
run says nothing about identity.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.gradients.expected import SAME
from analysis.gradients.tolerances import Tolerances
from runner.modes import ALL_REDUCE_SENTENCE, BUILT_IN, AutogradAllReduce, Reduction, facts

TORCH_NN = f"sum[{AutogradAllReduce.torch_nn.value}]"
IDENTITY = f"sum[{AutogradAllReduce.identity.value}]"
WITHOUT = [Reduction.local.value, Reduction.detached.value]  # no all-reduce in the graph


def _names(labels) -> str:
    return ", ".join(f"`{label}`" for label in labels)


def _scales(rows: pd.DataFrame) -> str:
    low, high = rows["factor"].min(), rows["factor"].max()
    return f"{low:.6f}" if f"{low:.6f}" == f"{high:.6f}" else f"{low:.6f} to {high:.6f}"


def _over_w(rows: pd.DataFrame) -> pd.Series:
    return (rows["verdict"] == "rescaled") & np.isclose(rows["factor"] * rows["world_size"], 1, rtol=1e-3)


def _without_collective(rows: pd.DataFrame, comm: pd.DataFrame | None) -> pd.Series:
    """Runs that issue `local`'s loss all-reduces per step (N, and one for logging), no more: as counted
    (comm.csv), else by the mode's facts (a custom callable's own collectives are known only when counted)."""
    local = facts(Reduction.local)
    allowed = rows["grad_accum"].map(lambda m: sum(local.loss_collectives(int(m)).values()))
    counted = pd.Series(np.nan, index=rows.index)
    if comm is not None and "loss_all_reduce_calls" in comm:
        counted = pd.to_numeric(comm["loss_all_reduce_calls"].reindex(rows.index), errors="coerce")
    built_in = {m.value for m in BUILT_IN}
    by_facts = pd.Series(
        [
            label in built_in and facts(label).loss_collectives(2) == local.loss_collectives(2)
            for label in rows["reduction"]
        ],
        index=rows.index,
        dtype=bool,
    )
    return counted.le(allowed) | (counted.isna() & by_facts)


def rfc_answer(table: pd.DataFrame, comm: pd.DataFrame | None = None, tol: Tolerances = Tolerances()) -> str:
    """The paragraph (empty when the runs show none of it)."""
    compared = table[
        ~table["verdict"].isin(["reference", "no reference", "failed", "not run"]) & (table["world_size"] > 1)
    ]
    used = [a for a in AutogradAllReduce if ALL_REDUCE_SENTENCE[a] in set(table["all_reduce"])]
    sentences = [ALL_REDUCE_SENTENCE[a] for a in used]

    torch_nn = compared[compared["reduction"] == TORCH_NN]
    identity = compared[compared["reduction"] == IDENTITY]
    without = compared[compared["reduction"].isin(WITHOUT) & _over_w(compared)]  # no all-reduce in the graph
    evidence = []
    if len(without):
        evidence.append(
            f"without it ({_names(sorted(set(without['reduction'])))}) the gradient is grad L / W "
            f"(step-1 scale {_scales(without)})"
        )
    if len(identity) and _over_w(identity).all():
        local = without[without["reduction"] == Reduction.local.value]
        as_local = len(local) and np.isclose(identity["factor"].mean(), local["factor"].mean(), rtol=tol.scale_rtol)
        evidence.append(
            f"with an identity backward (`{IDENTITY}`) it is not needed and does nothing for the gradient, which "
            f"is grad L / W (step-1 scale {_scales(identity)})" + (", as `local`'s" if as_local else "")
        )
    elif len(identity):
        sentences.append(f"`{IDENTITY}` against the reference: {', '.join(sorted(set(identity['verdict_text'])))}.")
    if evidence:
        with_sum, verb = "`sum` (funcol, the reference)", "gets"
        if len(torch_nn) and torch_nn["verdict"].isin(SAME).all():
            with_sum += f" and `{TORCH_NN}` (xtuner's import; step-1 scale {_scales(torch_nn)})"
            verb = "get"
        sentences.append(
            f"With a SUM-backward all-reduce, {with_sum} {verb} grad L, so the collective is needed for the "
            f"gradient's scale under FSDP's mean: " + "; ".join(evidence) + "."
        )
    elif len(torch_nn):
        sentences.append(f"`{TORCH_NN}` against the reference: {', '.join(sorted(set(torch_nn['verdict_text'])))}.")

    correct = compared[compared["verdict"].isin(SAME) & _without_collective(compared, comm)]
    by_fsdp = {
        "FSDP SUM": sorted(set(correct.loc[correct["fsdp_reduction"] == "sum", "reduction"])),
        "W x loss under FSDP's mean": sorted(set(correct.loc[correct["fsdp_reduction"] == "mean", "reduction"])),
    }
    replacements = [f"{how} ({_names(labels)})" for how, labels in by_fsdp.items() if labels]
    if replacements:
        sentences.append(
            " or ".join(replacements)
            + " replaces it: grad L with no per-micro-batch collective (the loss all-reduces of `local`: N and one "
            "for logging per step)."
        )
    if not sentences:
        return ""
    return "**The RFC** (is the loss's differentiable all-reduce needed?): " + " ".join(sentences)
