"""The steps table as [run, step] arrays: row i is run i of a runs table, column t - 1 is step t, NaN where a
run has no such step. Every measure over the runs (the gradients', the collective counts) is one vectorised
expression on them."""

from __future__ import annotations

import numpy as np
import pandas as pd


def _positions(steps: pd.DataFrame, run_ids: pd.Series) -> tuple[np.ndarray, np.ndarray, int]:
    """(which steps rows belong to `run_ids`, their flat index run * n_steps + step - 1, n_steps)."""
    n_steps = int(steps["step"].max()) if len(steps) else 1  # one unlogged column when no run logged a step
    row = pd.Categorical(steps["run"], categories=run_ids).codes
    keep = row >= 0
    return keep, row[keep].astype(np.int64) * n_steps + steps["step"].to_numpy()[keep].astype(int) - 1, n_steps


def step_arrays(
    steps: pd.DataFrame, run_ids: pd.Series, columns: list[str]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(logged[run, step], {column: values[run, step]}) with NaN where a run has no such step."""
    keep, flat, n_steps = _positions(steps, run_ids)
    logged = np.zeros((len(run_ids), n_steps), dtype=bool)
    logged.ravel()[flat] = True
    arrays = {}
    for column in columns:
        values = np.full((len(run_ids), n_steps), np.nan)
        if column in steps:
            values.ravel()[flat] = _kept(pd.to_numeric(steps[column], errors="coerce").to_numpy(dtype=float), keep)
        arrays[column] = values
    return logged, arrays


def step_stack(steps: pd.DataFrame, run_ids: pd.Series, columns: list[str]) -> np.ndarray:
    """values[run, step, k] of the float `columns` (the sketch), NaN where a run has no such step."""
    keep, flat, n_steps = _positions(steps, run_ids)
    values = np.full((len(run_ids), n_steps, len(columns)), np.nan)
    values.reshape(-1, len(columns))[flat] = _kept(steps[columns].to_numpy(dtype=float), keep)
    return values


def _kept(values: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """values[keep], without the copy where every row is kept (the usual case: a copy of a million steps
    is fresh memory, whose first touch costs more than the copying)."""
    return values if keep.all() else values[keep]
