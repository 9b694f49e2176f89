"""The trainers table (trainers.csv; the report's "Trainers" section and sentences: `analysis.report.trainers`).

A trainer here is a run whose mode is a trainer's rule rather than one of the
runner's own modes with funcol's all-reduce: a custom callable
(`custom:MODULE:CALLABLE`, e.g. examples/reductions/) or `sum` with another
differentiable all-reduce (`sum[torch_nn]`, `sum[identity]`). Each is set
beside its group's reference (`sum`, funcol): its rule, its gradient against
grad L as measured (the verdict), the step-1 factor, whether its loss curve
matches the reference's, and what it was expected to give. Nothing here is
known in advance: a custom run's gradient is what the run measured.

Beside them, what the run records of its code (`analysis.load.provenance`):
the package and version whose functions ran, or the repository, commit and
files a paraphrase follows (`upstream`); the kinds of evidence behind the
rule, from the same records (`evidence`: release, upstream_tests,
issue_example, paraphrase, paper, constructed, strongest first; trainers.csv
names each test in full); the backward of the graph's differentiable
all-reduce as measured at the run's start (`backward`: SUM, identity, or
the factor, with the torch version); and its collectives as
counted (comm.csv): the loss all-reduces per step, and its other collectives
beyond `local`'s (a rule's own all-gather, such as the Hugging Face Trainer's
token count, is not a loss all-reduce).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.load.provenance import COLUMNS as PROVENANCE
from analysis.load.sweeps import NOT_RUN
from runner.modes import ALL_REDUCE_BACKWARD, MODES, AutogradAllReduce

UNRECORDED = (*NOT_RUN, "unfinished")  # statuses of runs whose ranks recorded nothing in summary.json
COLUMNS = {
    "group_label": "group",
    "reduction": "trainer",
    "rule": "rule",
    "code": "code that ran",
    "evidence": "evidence",
    "fsdp_reduction": "FSDP",
    "backward_text": "all-reduce backward (measured)",
    "loss_all_reduce_calls": "loss all-reduces / step",
    "own_loss_all_reduce_calls": "of them the rule's own",
    "extra_other_calls_vs_local": "other collectives vs local",
    "gradient_vs_grad_L": "gradient vs grad L",
    "factor": "factor",
    "curves_match": "curves match",
    "expected": "expected",
    "as_expected": "as expected",
}


def is_trainer(label: pd.Series) -> pd.Series:
    """Labels that are not one of the runner's own modes as the reference runs it: a custom rule (by its
    `custom.name`, or `custom:MODULE:CALLABLE`), or `sum` with another all-reduce (`sum[identity]`)."""
    return label.notna() & ~label.astype(str).isin(MODES)


def _rule(row: pd.Series) -> str:
    """What the run's loss does: `custom.rule` (or its callable) for a custom run, the all-reduce's for `sum`."""
    if isinstance(row.get("custom.fn"), str):
        rule = row.get("custom.rule")
        return rule if isinstance(rule, str) else f"{row.get('custom.fn')} (no custom.rule)"
    implementation = AutogradAllReduce(
        row.get("autograd_all_reduce") if isinstance(row.get("autograd_all_reduce"), str) else "funcol"
    )
    backward = {"sum": "SUM", "identity": "identity"}[ALL_REDUCE_BACKWARD[implementation]]
    return f"sum: all-reduce of S/N with {implementation.value}, {backward} backward, FSDP {row['fsdp_reduction']}"


def _gradient(row: pd.Series) -> str:
    """The measured gradient against grad L (the reference's), in words."""
    verdict = row["verdict"]
    if verdict == "reference":
        return "grad L (the reference)"
    if verdict in ("identical", "equivalent"):
        return "grad L"
    if verdict == "rescaled":
        return f"grad L × {row['factor_label']}"
    if verdict == "different":
        cos = row["sketch_cos_step1"]
        if pd.notna(cos) and abs(1 - cos) > 0:
            return f"another direction (step-1 cosine {cos:.4f})"
        return "another gradient"
    return str(row["verdict_text"])


def backward_kind(factor: float, world_size: float) -> str:
    """What a measured backward factor is at W ranks: "SUM" (W), "identity" (1), "SUM = identity" (W = 1, where
    they agree), or the factor itself; "" where nothing was measured (no all-reduce in the graph)."""
    if not np.isfinite(factor):
        return ""
    if world_size == 1 and factor == 1:
        return "SUM = identity"
    return {float(world_size): "SUM", 1.0: "identity"}.get(float(factor), f"×{factor:g}")


def _backward_text(row: pd.Series) -> str:
    """The measured backward in the table's words: "SUM (×2 on every rank, funcol, torch 2.13.0)"."""
    kind = row["backward"]
    if row["status"] in UNRECORDED:
        return "-"
    if not kind:
        if row.get("all_reduce"):
            return "not measured (an earlier runner)"
        return "none declared" if isinstance(row.get("custom.fn"), str) else "none in the graph"
    ranks = str(row.get("backward_per_rank") or "")
    same = len(set(ranks.split("/"))) == 1
    where = f"×{row['backward_factor']:g} on every rank" if same else f"×{ranks} per rank"
    return f"{kind} ({where}, {row['backward_implementation']}, torch {row['backward_torch']})"


def _code(row: pd.Series) -> str:
    """The code whose rule ran: the package and version called, or the paraphrased repository@commit (files)."""
    if row.get("upstream"):
        return str(row["upstream"])
    if row["status"] in UNRECORDED:
        return "-"
    if isinstance(row.get("custom.fn"), str):
        return "not recorded (an earlier runner)"
    return "the runner's own"


def _evidence(row: pd.Series) -> str:
    """The kinds of evidence behind the rule ("release, upstream_tests"); "-" for the runner's own modes and runs
    that recorded nothing."""
    if isinstance(row.get("evidence"), str) and row["evidence"]:
        return row["evidence"]
    if isinstance(row.get("custom.fn"), str) and row["status"] not in UNRECORDED:
        return "not recorded (an earlier runner)"
    return "-"


def judged_elsewhere(runs: pd.DataFrame) -> pd.Series:
    """Runs with a section of their own, against their own question: post-training modes (objective=pg: against
    themselves at W=1 and the papers) and known bugs' arms (`known_bug.*`: buggy, fixed, reference)."""
    post_training = runs.get("objective.name", pd.Series(None, index=runs.index)).eq("pg")
    bug = runs.get("known_bug.name", pd.Series(None, index=runs.index)).notna()  # the arms have defaults
    return post_training | bug


def trainers_table(runs: pd.DataFrame, table: pd.DataFrame, comm: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per trainer run and per reference of a group that holds one (empty: the sweep has none);
    `comm` (comm.csv, row for row with `runs`) gives the counted collectives."""
    trainer = is_trainer(table["reduction"]) & ~judged_elsewhere(runs).reindex(table.index, fill_value=False)
    groups = set(table.loc[trainer, "group"])
    chosen = table["group"].isin(groups) & (trainer | (table["verdict"] == "reference"))
    if not chosen.any():
        return pd.DataFrame(
            columns=["run", *COLUMNS, "upstream_detail", "evidence_detail", "backward", "verdict", "reason"]
        )
    recorded = ("autograd_all_reduce", "custom.fn", "custom.rule", *PROVENANCE)
    config = runs.loc[chosen, [c for c in recorded if c in runs and c not in table]]
    rows = pd.concat([table.loc[chosen], config], axis=1)
    counted = ("loss_all_reduce_calls", "own_loss_all_reduce_calls", "extra_other_calls_vs_local")
    for column in counted:
        rows[column] = comm.loc[rows.index, column] if comm is not None and column in comm else np.nan
    rows["backward"] = [backward_kind(f, w) for f, w in zip(rows["backward_factor"], rows["world_size"])]
    rows["backward_text"] = [_backward_text(row) for _, row in rows.iterrows()]
    rows["code"] = [_code(row) for _, row in rows.iterrows()]
    rows["evidence"] = [_evidence(row) for _, row in rows.iterrows()]
    rows["rule"] = [_rule(row) for _, row in rows.iterrows()]
    rows["gradient_vs_grad_L"] = [_gradient(row) for _, row in rows.iterrows()]
    rows["curves_match"] = rows["loss_matches"].where(rows["verdict"] != "reference", True)
    return rows


def trainers_csv(rows: pd.DataFrame) -> pd.DataFrame:
    """trainers.csv: the report's columns (named as there), with each run's id, verdict and the reason for it."""
    shown = rows[["run", *COLUMNS, "upstream_detail", "evidence_detail", "verdict", "reason"]]
    return shown.rename(
        columns={**COLUMNS, "upstream_detail": "code that ran (in full)", "evidence_detail": "evidence (in full)"}
    )
