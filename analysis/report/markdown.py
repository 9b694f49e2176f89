"""What the report's sections share: a DataFrame as a Markdown table, rows in the modes' order, numbers and names
in words."""

from __future__ import annotations

import pandas as pd

from runner.modes import label_order

# Columns whose missing value means "it never happened" (a curve that never departs from its baseline's).
NEVER = ("departs at", "first_step_beyond", "diverged_at")


def readable(frame: pd.DataFrame, floatfmt: str = ".4g") -> pd.DataFrame:
    """`frame` with no NaN a reader would see: "never" in NEVER's columns, "-" elsewhere (a run that did not
    measure it: not run, failed, too few steps for an interval); a column with such a cell has its numbers
    written in `floatfmt` here (it becomes a column of text)."""
    shown = frame.copy()
    for column in frame.columns:
        missing = frame[column].isna()
        if not missing.any():
            continue
        values = frame[column].astype(object)
        written = [
            ("never" if column in NEVER else "-")
            if gone
            else format(value, floatfmt)
            if isinstance(value, float)
            else value
            for value, gone in zip(values, missing)
        ]
        shown[column] = pd.Series(written, index=frame.index, dtype=object)
    return shown


def table(frame: pd.DataFrame, empty: str = "(none)", floatfmt: str = ".4g") -> str:
    """A Markdown table of `frame`: numbers in `floatfmt`, no `nan` cell (`readable`)."""
    if not len(frame):
        return empty
    return readable(frame, floatfmt).to_markdown(index=False, floatfmt=floatfmt, missingval="-")


def by_mode(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows by group, then in the modes' order (sum first, the negative control last)."""
    order = frame["reduction"].map(label_order)  # sum[...] after sum, custom callables last
    return frame.assign(_order=order).sort_values(["group_label", "_order"]).drop(columns="_order")


def span(values: pd.Series, fmt: str) -> str:
    """The range of `values` in `fmt` ("0.5", "0.5 to 0.7"); "n/a" when there are none."""
    values = values.dropna()
    if values.empty:
        return "n/a"
    low, high = values.min(), values.max()
    return format(low, fmt) if format(low, fmt) == format(high, fmt) else f"{format(low, fmt)} to {format(high, fmt)}"


def names(labels) -> str:
    return ", ".join(f"`{label}`" for label in labels)


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def listed(items: list[str]) -> str:
    """a; a and b; a, b and c."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
