"""runs.parquet: every step with its run's config and status; runs without steps keep one row.

Built in Arrow: each run's columns are gathered per step by index (`take`), with
strings dictionary-encoded, and written one slice of steps at a time (a row
group each). Gathered all at once, the run columns of a million steps would be
half a gigabyte of fresh memory, whose first touch costs more than the gathering.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from analysis.load.sweeps import Sweeps

ROWS_PER_GROUP = 1 << 17


def run_columns(runs: pd.DataFrame) -> pa.Table:
    """One row per run, strings dictionary-encoded (what each of its steps repeats)."""
    table = pa.Table.from_pandas(
        runs.astype({c: str for c in runs.columns if runs[c].dtype == object}), preserve_index=False
    )
    return pa.table(
        {
            name: pc.dictionary_encode(col)
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
            else col
            for name, col in zip(table.column_names, table.columns)
        }
    )


def write_runs_parquet(sweeps: Sweeps, path: Path) -> None:
    runs = run_columns(sweeps.runs)
    steps = pa.Table.from_pandas(sweeps.steps.drop(columns=["run", "sp"], errors="ignore"), preserve_index=False)
    schema = pa.schema([*runs.schema, *steps.schema.remove_metadata()])
    run_of_step = pa.array(sweeps.steps["run"].cat.codes.to_numpy())
    without_steps = runs.filter(pc.equal(runs.column("steps_logged"), 0))
    # Dictionary pages for the run columns (a few values each); the step columns (mostly distinct floats,
    # for which the encoder would build a dictionary only to give it up) are written plain: 30 % less CPU.
    # Through a buffer: the writer's own file would take some 11,000 writes (and a seek each time it asks
    # where it is), a page each.
    with (
        pa.output_stream(path, buffer_size=1 << 20) as sink,
        pq.ParquetWriter(sink, schema, use_dictionary=runs.column_names) as writer,
    ):
        for start in range(0, len(steps), ROWS_PER_GROUP):
            per_step = runs.take(run_of_step.slice(start, ROWS_PER_GROUP))
            writer.write_table(
                pa.Table.from_arrays([*per_step.columns, *steps.slice(start, ROWS_PER_GROUP).columns], schema=schema)
            )
        if len(without_steps):
            no_steps = [pa.nulls(len(without_steps), field.type) for field in steps.schema]
            writer.write_table(pa.Table.from_arrays([*without_steps.columns, *no_steps], schema=schema))
