"""What the report's tables share: a DataFrame as a Markdown table, and rows in the modes' order."""

from __future__ import annotations

import pandas as pd

from runner.modes import label_order


def table(frame: pd.DataFrame, empty: str = "(none)") -> str:
    return frame.to_markdown(index=False, floatfmt=".4g", missingval="") if len(frame) else empty


def by_mode(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows by group, then in the modes' order (sum first, the negative control last)."""
    order = frame["reduction"].map(label_order)  # sum[...] after sum, custom callables last
    return frame.assign(_order=order).sort_values(["group_label", "_order"]).drop(columns="_order")
