"""The report's "Trainers" section (the trainers table) and one sentence per trainer for its answer."""

from __future__ import annotations

import pandas as pd

from analysis.report.markdown import listed, table
from analysis.trainers.table import COLUMNS, is_trainer
from runner.modes import label_order


def trainer_sentences(rows: pd.DataFrame) -> list[str]:
    """One bullet per trainer run: its rule, what it measured against the reference, and its expectation."""
    sentences = []
    for _, row in rows[is_trainer(rows["reduction"])].iterrows():
        if row["verdict"] in _NOT_COMPARED:
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
        hook = row.get("hook_norm_ratio_median", float("nan"))
        norm = (
            f"; its logged grad norm (the rule's grad_norm hook) is ×{hook:.4g} the gradient's norm"
            if pd.notna(hook) and abs(hook - 1) > 1e-3
            else ""
        )
        sentences.append(
            f"- `{row['reduction']}` ({row['rule']}): {row['gradient_vs_grad_L']}, step-1 scale {row['factor']:.6f}; "
            f"{curve}{norm}{expectation}."
        )
    return sentences


def trainers_markdown(rows: pd.DataFrame) -> str:
    """The trainers table as report.md shows it."""
    shown = rows[list(COLUMNS)].rename(columns=COLUMNS)
    return table(shown, floatfmt=".6g")


QUESTION = "Do the trainers' rules give grad L, as the reference does?"
_NOT_COMPARED = ("failed", "not run", "no reference")  # verdicts of runs that never met their reference


def trainers_answer(rows: pd.DataFrame) -> str:
    """Whether the trainers' rules give grad L (the reference's gradient), in one sentence: how many do, and what
    each of the others gives as measured."""
    trainers = rows[is_trainer(rows["reduction"])]
    true = trainers["gradient_vs_grad_L"] == "grad L"
    if true.all():
        return f"{QUESTION} Yes, {'it does' if len(trainers) == 1 else f'all {len(trainers)} do'}."
    said = [
        f"`{row['reduction']}` {row['verdict']}"
        if row["verdict"] in _NOT_COMPARED
        else f"`{row['reduction']}` gives {row['gradient_vs_grad_L']}"
        for _, row in trainers[~true].iterrows()
    ]
    # one clause per distinct finding (a rule run at several layouts often gives the same at each)
    others = [
        f"{clause} ({said.count(clause)} runs)" if said.count(clause) > 1 else clause for clause in dict.fromkeys(said)
    ]
    # Only a run compared with its reference answers the question; the others are named, never counted as "no".
    measured = ~trainers["verdict"].isin(_NOT_COMPARED)
    if not measured.any():
        return (
            f"{QUESTION} Not measured: no trainer's run here was compared with a reference; " + "; ".join(others) + "."
        )
    of = f"of the {measured.sum()} compared with a reference" if not measured.all() else f"of {len(trainers)}"
    return f"{QUESTION} No, {true.sum()} {of} do; " + "; ".join(others) + "."


def _named(labels) -> str:
    return listed([f"`{label}`" for label in sorted(set(labels), key=label_order)])


def backward_sentence(rows: pd.DataFrame) -> str:
    """Which rules' graphs hold an all-reduce with a SUM backward, as each run measured it at its start, which an
    identity one, and which none; "" where no run measured one."""
    measured = rows[rows["backward"] != ""]
    if measured.empty:
        return ""
    torch = ", ".join(sorted(set(measured["backward_torch"].dropna().astype(str))))
    kinds = measured.groupby("backward", sort=False)["reduction"].agg(list)
    phrases = {
        "SUM": "a SUM backward (each rank's loss receives W) in {}",
        "identity": "an identity backward (each rank's loss receives 1) in {}",
        "SUM = identity": "a backward that gives 1 at W=1, where SUM and identity agree, in {}",
    }
    parts = [
        phrases.get(kind, f"a backward of {kind} in {{}}").format(_named(labels)) for kind, labels in kinds.items()
    ]
    # A label measured at some layouts only (W=1 beside W=2) is named under each kind it showed.
    none = rows.loc[rows["backward_text"].isin(["none in the graph", "none declared"]), "reduction"]
    none = sorted(set(none) - set(measured["reduction"]), key=label_order)
    text = (
        f"The all-reduce in the loss's graph, its backward measured at each run's start (torch {torch}): "
        + "; ".join(parts)
    )
    return text + (f"; none in the graph (none measured, none declared) of {_named(none)}." if none else ".")


def trainers_section(trainers: pd.DataFrame | None) -> list[str]:
    """The trainers table (`analysis.trainers.table`), where the sweep holds custom callables or other all-reduces."""
    if trainers is None or not is_trainer(trainers["reduction"]).any():
        return []
    return [
        "## Trainers",
        "",
        trainers_answer(trainers),
        "",
        *([backward_sentence(trainers), ""] if backward_sentence(trainers) else []),
        trainers_markdown(trainers),
        "",
        "Each trainer's gradient as measured against its group's reference (`sum`, funcol): its step-1 factor "
        "(gradient sketch), whether its loss curve stays within tolerance of the reference's, and what it was "
        "expected to give (`custom.expect`; a custom run without one is not judged). The code that ran: the "
        "package and version whose functions the rule called, or the repository@commit (files) its paraphrase "
        "follows. Its evidence, strongest first: release (a release's own code called, or run beside the rule by a "
        "test of this repository), upstream_tests (upstream's own test cases reproduced), issue_example (an "
        "upstream report's own example), paraphrase (upstream code read at a commit and written out), paper (a "
        "published objective written out), constructed (a rule of its own); trainers.csv names each test and the "
        "part of the rule it holds. Loss all-reduces per step are counted in forward/backward (N's, the logged "
        "loss's, the rule's own); other collectives vs local counts the rest beyond `local`'s (the Hugging Face "
        "Trainer's all-gather of the token count is one: not a loss all-reduce). trainers.csv.",
        "",
    ]
