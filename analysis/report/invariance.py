"""The report's "Invariance to the layout" section (invariance.csv as a table)."""

from __future__ import annotations

import pandas as pd

from analysis.report.markdown import table


def invariance_section(invariance: pd.DataFrame) -> list[str]:
    sections = ["## Invariance to the layout", ""]
    if invariance.empty:
        return sections + ["Every config ran in one layout: sweep world_size, sp or grad_accum to see this.", ""]
    return sections + [
        table(invariance.drop(columns=["family"]) if invariance["family"].nunique() <= 1 else invariance),
        "",
    ]
