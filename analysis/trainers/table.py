"""The trainers table (trainers.csv; the report's "Trainers" section and sentences: `analysis.report.trainers`).

A trainer here is a run whose mode is a trainer's rule rather than one of the
runner's own modes with funcol's all-reduce: a custom callable
(`custom:MODULE:CALLABLE`, e.g. examples/reductions/) or `sum` with another
differentiable all-reduce (`sum[torch_nn]`, `sum[identity]`). Each is set
beside its group's reference (`sum`, funcol): its rule, its gradient against
grad L as measured (the verdict), the step-1 factor, whether its loss curve
matches the reference's, and what it was expected to give. Nothing here is
known in advance: a custom run's gradient is what the run measured.
"""

from __future__ import annotations

import pandas as pd

from runner.modes import ALL_REDUCE_BACKWARD, MODES, AutogradAllReduce

COLUMNS = {
    "group_label": "group",
    "reduction": "trainer",
    "rule": "rule",
    "fsdp_reduction": "FSDP",
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


def trainers_table(runs: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """One row per trainer run and per reference of a group that holds one (empty: the sweep has none)."""
    trainer = is_trainer(table["reduction"])
    groups = set(table.loc[trainer, "group"])
    chosen = table["group"].isin(groups) & (trainer | (table["verdict"] == "reference"))
    if not chosen.any():
        return pd.DataFrame(columns=list(COLUMNS))
    config = runs.loc[chosen, [c for c in ("autograd_all_reduce", "custom.fn", "custom.rule") if c in runs]]
    rows = pd.concat([table.loc[chosen], config], axis=1)
    rows["rule"] = [_rule(row) for _, row in rows.iterrows()]
    rows["gradient_vs_grad_L"] = [_gradient(row) for _, row in rows.iterrows()]
    rows["curves_match"] = rows["loss_matches"].where(rows["verdict"] != "reference", True)
    return rows


def trainers_csv(rows: pd.DataFrame) -> pd.DataFrame:
    """trainers.csv: the report's columns (named as there), with each run's id, verdict and the reason for it."""
    return rows[["run", *COLUMNS, "verdict", "reason"]].rename(columns=COLUMNS)
