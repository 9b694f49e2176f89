"""The report's "Known bugs" section (the known-bugs table, `analysis.bugs.table`) and its answer; the README's
compact form of a run's bugs.csv (`python -m analysis.report.bugs OUT/bugs.csv` prints it)."""

from __future__ import annotations

import sys

import pandas as pd

from analysis.bugs.table import COLUMNS, NOT_REPRODUCED, results_in_words

QUESTION = "Does each known bug reproduce here, and does its fix give the reference's gradient?"


def bugs_answer(rows: pd.DataFrame) -> str:
    """The answer in one plain sentence: how many bugs showed as stated with their fix equivalent, on what
    evidence, and which did not."""
    missed = rows["result"] == NOT_REPRODUCED
    if not missed.any():
        which = "the one bug" if len(rows) == 1 else f"all {len(rows)} bugs"
        return f"{QUESTION} Yes: {which} showed as stated, each fix grad L ({results_in_words(rows)})."
    why = "; ".join(f"{row['bug']}: {row['why']}" for _, row in rows[missed].iterrows())
    return f"{QUESTION} No: {results_in_words(rows)}; not reproduced: {why}."


def bugs_markdown(rows: pd.DataFrame) -> str:
    shown = rows[list(COLUMNS)].rename(columns=COLUMNS)
    return shown.to_markdown(index=False, missingval="")


def bugs_section(rows: pd.DataFrame | None) -> list[str]:
    """The known-bugs table where the sweep holds known bugs' arms (conf/bug/)."""
    if rows is None or rows.empty:
        return []
    return [
        "## Known bugs",
        "",
        bugs_answer(rows),
        "",
        bugs_markdown(rows),
        "",
        "Each bug's buggy arm (the upstream logic before the fix) and fixed arm, against the reference `sum` at the "
        "layout that shows it; 'buggy vs fixed' is the ratio of their step-1 gradient scales and grad norms. "
        "Reproduced: the buggy arm gives what the bug states (known_bug.buggy.expect), the fix gives grad L, and a "
        "release, upstream's own tests or the report's own example stands behind the arm (known_bug.evidence); "
        "'shown (paraphrase)' and 'constructed' show as stated on weaker evidence: code read at a pinned commit, "
        "or a state the report describes that no upstream code is known to have run. bugs.csv.",
        "",
    ]


# The README's columns: bugs.csv's name -> the README's.
README_COLUMNS = {
    "bug": "bug",
    "reference": "reference",
    "layout": "layout",
    "reported signature": "signature",
    "evidence": "evidence",
    "buggy vs reference": "measured (buggy vs reference)",
    "result": "result",
}


def readme_table(csv: pd.DataFrame) -> str:
    """The README's "Known bugs" table from a run's bugs.csv: one row per bug, its measured buggy arm, the kind of
    evidence behind it (bugs.csv holds the source too) and the result."""
    shown = csv[list(README_COLUMNS)].copy()
    shown["evidence"] = shown["evidence"].astype(str).str.split(":", n=1).str[0]
    return shown.rename(columns=README_COLUMNS).to_markdown(index=False, tablefmt="github")


if __name__ == "__main__":
    print(readme_table(pd.read_csv(sys.argv[1])))
