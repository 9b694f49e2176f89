"""Loading a sweep: the metrics' Arrow copies give the same steps as parsing metrics.jsonl, and a stale copy is not used."""

from __future__ import annotations

import json

import pandas as pd

from analysis.load import load_sweeps
from analysis.synthetic import SyntheticRun, write_sweep


def _sweep(tmp_path):
    runs = [
        SyntheticRun("sum", steps=30), SyntheticRun("local", steps=30, factor=0.5),
        SyntheticRun("scaled", steps=30, status="diverged", diverge_at=7), SyntheticRun("fsdp_sum", steps=30, status="failed", fail_after=4),
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
