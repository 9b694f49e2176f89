"""The report's "Trainers" section (the trainers table) and one sentence per trainer for its answer."""

from __future__ import annotations

import pandas as pd

from analysis.trainers.table import COLUMNS, is_trainer


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
            f"- `{row['reduction']}` ({row['rule']}): {row['gradient_vs_grad_L']}, step-1 scale {row['factor']:.6f}; "
            f"{curve}{expectation}."
        )
    return sentences


def trainers_markdown(rows: pd.DataFrame) -> str:
    """The trainers table as report.md shows it."""
    shown = rows[list(COLUMNS)].rename(columns=COLUMNS)
    return shown.to_markdown(index=False, floatfmt=".6g", missingval="")


QUESTION = "Do the trainers' rules give grad L, as the reference does?"


def trainers_answer(rows: pd.DataFrame) -> str:
    """Whether the trainers' rules give grad L (the reference's gradient), in one sentence: how many do, and what
    each of the others gives as measured."""
    trainers = rows[is_trainer(rows["reduction"])]
    true = trainers["gradient_vs_grad_L"] == "grad L"
    if true.all():
        return f"{QUESTION} Yes, {'it does' if len(trainers) == 1 else f'all {len(trainers)} do'}."
    others = [
        f"`{row['reduction']}` {row['verdict']}"
        if row["verdict"] in ("failed", "not run", "no reference")
        else f"`{row['reduction']}` gives {row['gradient_vs_grad_L']}"
        for _, row in trainers[~true].iterrows()
    ]
    return f"{QUESTION} No, {true.sum()} of {len(trainers)} do; " + "; ".join(others) + "."


def trainers_section(trainers: pd.DataFrame | None) -> list[str]:
    """The trainers table (`analysis.trainers.table`), where the sweep holds custom callables or other all-reduces."""
    if trainers is None or not is_trainer(trainers["reduction"]).any():
        return []
    return [
        "## Trainers",
        "",
        trainers_answer(trainers),
        "",
        trainers_markdown(trainers),
        "",
        "Each trainer's gradient as measured against its group's reference (`sum`, funcol): its step-1 factor "
        "(gradient sketch), whether its loss curve stays within tolerance of the reference's, and what it was "
        "expected to give (`custom.expect`; a custom run without one is not judged). trainers.csv.",
        "",
    ]
