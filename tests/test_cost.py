"""The cost half with real processes: interleaved vs sequential under a load change, sampled counting, packed data.

The load test starts busy processes half-way through a measurement, as a
second job or a compile on a shared machine would. The interleaved method
compares the arms of each step, so its null control (`fsdp_sum`, `scaled`:
`local`'s work) still holds 1.00; the old estimate, `local` and `fsdp_sum` as
jobs run one after another, reports the load as a cost.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import torch
from gloo_world import run_in_world
from helpers import run_config

from analysis.cost.comm import comm_table
from analysis.cost.interleaved import cost_table
from analysis.gradients.groups import assign_groups
from analysis.load.sweeps import load_sweeps
from runner.config import counted_step
from runner.layout import ParallelLayout
from runner.model.parallel import build_meshes
from runner.sweep.machine import usable_cpu_cores
from runner.train.components import build_parts
from runner.train.loop import Trainer

RUNNER = [sys.executable, "-m", "runner"]
BUSY = [sys.executable, "-c", "while True: pass"]


@contextmanager
def cpu_load(processes: int = 2):
    """Busy processes (one per core here) until the block ends."""
    busy = [subprocess.Popen(BUSY) for _ in range(processes)]
    try:
        yield
    finally:
        for process in busy:
            process.kill()
            process.wait()


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def start_load_when(condition, job: subprocess.Popen, timeout_s: float = 300, processes: int = 2):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert job.poll() is None, job.communicate()
        assert time.monotonic() < deadline, "the job never reached the point where the load starts"
        time.sleep(0.1)
    return cpu_load(processes)


def test_load_mid_way_leaves_the_interleaved_null_control_at_one_and_fools_sequential_jobs(tmp_path):
    steps = 80
    cost_args = [
        "experiment=cost",
        f"train.steps={steps}",
        "cost.modes=[sum,local,fsdp_sum,scaled]",
        "cost.floor_calls=50",
        "wandb.mode=disabled",
        "hydra.run.dir=cost",
    ]
    job = subprocess.Popen(
        [*RUNNER, *cost_args], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    with start_load_when(lambda: lines(tmp_path / "cost" / "metrics.jsonl") >= steps // 2, job):
        output, _ = job.communicate(timeout=600)
    assert job.returncode == 0, output
    config = {
        "path": str(tmp_path / "cost"),
        "job": "cost",
        "world_size": 2,
        "sp": 1,
        "grad_accum": 2,
        "cost.warmup_steps": 5,
    }
    # A stricter level than the report's 5 %, so that the test fails by chance once in a thousand runs, not in twenty.
    interleaved = cost_table(pd.DataFrame([config]), confidence=0.999, level=0.001).set_index("mode")
    for null in ("fsdp_sum", "scaled"):
        assert interleaved.loc[null, "ci_low"] <= 1 <= interleaved.loc[null, "ci_high"], interleaved
        assert interleaved.loc[null, "verdict"] == "null: holds", interleaved

    # Records written every step (metrics.gather_every=1), so that the load starts at the second job's first step.
    sweep = [*RUNNER, "-m", "reduction=local,fsdp_sum", "train.steps=30", "metrics.count_comm=false", "metrics.gather_every=1",
             "wandb.mode=disabled", "hydra.sweep.dir=seq"]  # fmt: skip
    job = subprocess.Popen(sweep, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # The load starts once the second job has logged its first step: the first ran unloaded, the second loaded.
    second_started = lambda: any(lines(path) >= 1 for path in (tmp_path / "seq").glob("1_*/metrics.jsonl"))  # noqa: E731
    # Two busy processes per core: the contrast holds even where the machine's own load varies under the first job.
    with start_load_when(second_started, job, processes=2 * usable_cpu_cores()):
        output, _ = job.communicate(timeout=600)
    assert job.returncode == 0, output
    loaded = load_sweeps([tmp_path / "seq"])
    sequential = comm_table(assign_groups(loaded.runs).reset_index(drop=True), loaded.steps).set_index("reduction")
    # The load, which the ratio cannot tell from fsdp_sum's cost: why it is named uncontrolled and has no CI.
    assert sequential.loc["fsdp_sum", "step_time_vs_local_uncontrolled"] > 1.1, sequential


def full_and_sampled_counts() -> tuple[list, list]:
    meshes = build_meshes(ParallelLayout(2, 1, 2), "cpu")
    counts = []
    for every in (1, 3):
        cfg = run_config(grad_accum=2, train__steps=8, metrics__count_first=2, metrics__count_every=every)
        trainer = Trainer(build_parts(cfg, meshes, torch.device("cpu")))
        counts.append([trainer.step(step)["comm"] for step in range(1, 9)])
    return tuple(counts)


def test_sampled_counting_gives_the_counts_of_counting_every_step():
    (full, sampled), _ = run_in_world(full_and_sampled_counts, 2)
    cfg = run_config(train__steps=8, metrics__count_first=2, metrics__count_every=3)
    counted = [step for step in range(1, 9) if counted_step(step, 8, cfg.metrics)]
    assert counted == [1, 2, 3, 6, 8]
    calls_and_bytes = lambda comm: {k: (c["calls"], c["bytes"]) for k, c in comm.items()}  # noqa: E731
    every_step = [calls_and_bytes(c) for c in full]
    assert all(c == every_step[0] for c in every_step) and every_step[0]["all_reduce"][0] > 0  # the same every step
    for step, comm in enumerate(sampled, start=1):
        if step in counted:
            assert calls_and_bytes(comm) == every_step[step - 1]
        else:
            assert comm is None


def test_check_expects_mean_of_means_equivalent_on_packed_data(tmp_path):
    args = [
        "-m",
        "reduction=sum,mean_of_means",
        "data.packing=true",
        "train.steps=3",
        "wandb.mode=disabled",
        "hydra.sweep.dir=s",
    ]
    done = subprocess.run([*RUNNER, *args], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [
        json.loads(line)
        for line in next((tmp_path / "s").glob("*mean_of_means*/metrics.jsonl")).read_text().splitlines()
    ]
    assert all(r["micro_batch_tokens_min"] == r["micro_batch_tokens_max"] for r in records)  # full windows
    check = subprocess.run(
        [sys.executable, "-m", "analysis", str(tmp_path / "s"), "--check", "--no-plots", "--wandb", "disabled"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ},
    )
    assert check.returncode == 0, check.stdout + check.stderr
    verdicts = {row["reduction"]: row for row in csv.DictReader((tmp_path / "s" / "analysis" / "verdicts.csv").open())}
    assert verdicts["mean_of_means"]["expected"] == "equivalent"
    assert verdicts["mean_of_means"]["verdict"] in ("identical", "equivalent")
