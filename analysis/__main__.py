"""`python -m analysis [SWEEP_DIR]`: tables of a sweep (default: the newest under multirun/).

Writes SWEEP_DIR/analysis/runs.parquet (one row per job and step) and
jobs.csv (one row per job), and prints one line per job.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from analysis.load import load_jobs, load_steps, newest_sweep


def job_table(jobs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per job: first and last loss, first grad norm, and all-reduce calls per step."""
    if steps.empty:
        return jobs
    grouped = steps.sort_values("step").groupby("job")
    per_job = pd.DataFrame(
        {
            "loss_step1": grouped["loss"].first(),
            "loss_final": grouped["loss"].last(),
            "grad_norm_step1": grouped["grad_norm"].first(),
        }
    )
    if "comm_all_reduce_calls" in steps:
        per_job["all_reduce_per_step"] = grouped["comm_all_reduce_calls"].median()
    return jobs.merge(per_job, left_on="job", right_index=True, how="left")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", nargs="?", type=Path, help="a sweep directory (default: the newest under multirun/)")
    args = parser.parse_args(argv)
    sweep = args.sweep or newest_sweep()
    out = sweep / "analysis"
    out.mkdir(exist_ok=True)
    jobs, steps = load_jobs(sweep), load_steps(sweep)
    steps.to_parquet(out / "runs.parquet", index=False)
    table = job_table(jobs, steps)
    table.to_csv(out / "jobs.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.drop(columns=["error"]).to_string(index=False))
    print(f"\nwrote {out}/runs.parquet and jobs.csv")


if __name__ == "__main__":
    main()
