"""The report's "Known bugs" section (the known-bugs table, `analysis.bugs.table`) and its answer; the README's
compact form of a run's bugs.csv (`python -m analysis.report.bugs OUT/bugs.csv` prints it)."""

from __future__ import annotations

import sys

import pandas as pd

from analysis.bugs.table import COLUMNS

QUESTION = "Does each known bug reproduce here, and does its fix give the reference's gradient?"


def bugs_answer(rows: pd.DataFrame) -> str:
    """The answer in one plain sentence: how many bugs reproduced with their fix equivalent, and which did not."""
    done = rows["result"] == "reproduced"
    if done.all():
        return f"{QUESTION} Yes: {'the one bug' if len(rows) == 1 else f'all {len(rows)} bugs'} reproduced, each fix grad L."
    missed = "; ".join(f"{row['bug']}: {row['why']}" for _, row in rows[~done].iterrows())
    return f"{QUESTION} No: {done.sum()} of {len(rows)} reproduced; not reproduced: {missed}."


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
        "Reproduced: the buggy arm gives what the bug states (known_bug.buggy.expect) and the fix gives grad L. "
        "bugs.csv.",
        "",
    ]


# The README's columns: bugs.csv's name -> the README's.
README_COLUMNS = {
    "bug": "bug",
    "reference": "reference",
    "layout": "layout",
    "reported signature": "signature",
    "buggy vs reference": "measured (buggy vs reference)",
    "result": "result",
}


def readme_table(csv: pd.DataFrame) -> str:
    """The README's "Known bugs" table from a run's bugs.csv: one row per bug, its measured buggy arm and result."""
    return csv[list(README_COLUMNS)].rename(columns=README_COLUMNS).to_markdown(index=False, tablefmt="github")


if __name__ == "__main__":
    print(readme_table(pd.read_csv(sys.argv[1])))
