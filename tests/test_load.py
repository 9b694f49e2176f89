"""Loading a sweep: the metrics' Arrow copies give the same steps as parsing metrics.jsonl, a stale copy is not used;
runs.parquet, written in row groups, holds the one table of runs and steps."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from analysis.load import runs_parquet
from analysis.load.sweeps import load_sweeps
from analysis.testing.synthetic import SyntheticRun, write_sweep


def _sweep(tmp_path):
    runs = [
        SyntheticRun("sum", steps=30),
        SyntheticRun("local", steps=30, factor=0.5),
        SyntheticRun("scaled", steps=30, status="diverged", diverge_at=7),
        SyntheticRun("fsdp_sum", steps=30, status="failed", fail_after=4),
    ]
    return write_sweep(tmp_path / "sweep", runs)


def test_arrow_copies_and_parsed_jsonl_give_the_same_steps(tmp_path):
    sweep = _sweep(tmp_path)
    from_copies = load_sweeps([sweep])
    for copy in sweep.glob("*/metrics.arrow"):
        copy.unlink()
    parsed = load_sweeps([sweep])
    pd.testing.assert_frame_equal(from_copies.steps, parsed.steps)
    pd.testing.assert_frame_equal(from_copies.runs, parsed.runs)


def test_a_copy_older_than_its_jsonl_or_broken_is_not_read(tmp_path):
    sweep = _sweep(tmp_path)
    stale, broken = sorted(sweep.glob("*/metrics.arrow"))[:2]
    metrics = stale.with_suffix(".jsonl")
    last = json.loads(metrics.read_text().splitlines()[-1])
    with metrics.open("a") as out:  # a step appended after the copy was written
        out.write(json.dumps({**last, "step": last["step"] + 1}) + "\n")
    broken.write_bytes(b"not arrow")
    steps = load_sweeps([sweep]).steps
    per_run = steps.groupby("run", observed=True)["step"].max()
    assert per_run[f"sweep/{stale.parent.name}"] == 31
    assert per_run[f"sweep/{broken.parent.name}"] == 30


def test_runs_parquet_written_in_row_groups_holds_the_one_table_of_runs_and_steps(tmp_path, monkeypatch):
    """The file, written a slice of steps at a time, reads back as the table built at once (every step with
    its run's columns, then the runs without steps), schema included."""
    sweep = _sweep(tmp_path)
    write_sweep(
        sweep,
        [
            SyntheticRun("scaled", seed=1, steps=30, status="failed", fail_after=0),
            SyntheticRun("sum", status="invalid"),
        ],
    )
    sweeps = load_sweeps([sweep])
    monkeypatch.setattr(runs_parquet, "ROWS_PER_GROUP", 7)  # several row groups, cut inside runs
    runs_parquet.write_runs_parquet(sweeps, tmp_path / "runs.parquet")

    runs = runs_parquet.run_columns(sweeps.runs)
    steps = pa.Table.from_pandas(sweeps.steps.drop(columns=["run", "sp"]), preserve_index=False)
    per_step = runs.take(pa.array(sweeps.steps["run"].cat.codes.to_numpy()))
    joined = pa.Table.from_arrays(
        [*per_step.columns, *steps.columns], names=[*per_step.column_names, *steps.column_names]
    )
    without_steps = runs.filter(pc.equal(runs.column("steps_logged"), 0))
    pq.write_table(
        pa.concat_tables([joined, without_steps], promote_options="permissive"), tmp_path / "at_once.parquet"
    )

    written, expected = (pq.read_table(tmp_path / name) for name in ("runs.parquet", "at_once.parquet"))
    assert pq.ParquetFile(tmp_path / "runs.parquet").num_row_groups > 3 and len(without_steps) == 2
    assert written.schema.equals(expected.schema, check_metadata=True)
    assert written.equals(expected)
    pd.testing.assert_frame_equal(written.to_pandas(), expected.to_pandas())
