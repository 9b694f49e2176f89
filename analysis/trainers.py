"""The trainers table (trainers.csv, the report's "Trainers" section) and one sentence per trainer.

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

from runner.modes import ALL_REDUCE_BACKWARD, AutogradAllReduce

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
    return label.astype(str).str.startswith("custom:") | label.astype(str).str.contains("[", regex=False)


def _rule(row: pd.Series) -> str:
    """What the run's loss does: `custom.rule` (or its callable) for a custom run, the all-reduce's for `sum`."""
    if str(row["reduction"]).startswith("custom:"):
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


def trainer_sentences(rows: pd.DataFrame) -> list[str]:
    """One bullet per trainer run: its rule, what it measured against the reference, and its expectation."""
    sentences = []
    for _, row in rows[is_trainer(rows["reduction"])].iterrows():
        if row["verdict"] in ("failed", "not run", "no reference"):
            sentences.append(f"- `{row['reduction']}` ({row['rule']}): {row['verdict']}: {row['reason']}.")
            continue
        if row["curves_match"]:
            curve = "its loss curve matches the reference's"
        else:
            curve = (
                f"its loss curve departs from step {row['first_step_beyond']:.0f} and ends "
                f"{row['final_loss_diff']:+.3g} from the reference's"
            )
        judged = row["as_expected"]
        expectation = (
            "" if pd.isna(judged) else f"; expected {row['expected']}: {'as expected' if judged else 'NOT as expected'}"
        )
        sentences.append(
            f"- `{row['reduction']}` ({row['rule']}): {_gradient(row)}, step-1 scale {row['factor']:.6f}; "
            f"{curve}{expectation}."
        )
    return sentences


def trainers_markdown(rows: pd.DataFrame) -> str:
    """The trainers table as report.md shows it."""
    shown = rows[list(COLUMNS)].rename(columns=COLUMNS)
    return shown.to_markdown(index=False, floatfmt=".6g", missingval="")


def trainers_section(trainers: pd.DataFrame | None) -> list[str]:
    """The trainers table (`analysis.trainers`), where the sweep holds custom callables or other all-reduces."""
    if trainers is None or not is_trainer(trainers["reduction"]).any():
        return []
    return [
        "## Trainers",
        "",
        trainers_markdown(trainers),
        "",
        "Each trainer's gradient as measured against its group's reference (`sum`, funcol): its step-1 factor "
        "(gradient sketch), whether its loss curve stays within tolerance of the reference's, and what it was "
        "expected to give (`custom.expect`; a custom run without one is not judged). trainers.csv.",
        "",
    ]
