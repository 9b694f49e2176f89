"""Injected faults end a job as they should: failed with the failing rank's error, or diverged; nothing lost.

Real two-rank gloo jobs. Each test checks the job's status and error, that it
ended within seconds (not at timeout_s), and that every metrics line written
before the fault is whole JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

STEPS, FAULT_STEP = 4, 3
BASE = [
    "world_size=2",
    f"train.steps={STEPS}",
    "wandb.mode=disabled",
    "metrics.sketch_dim=0",
    f"fault.step={FAULT_STEP}",
]


def run_job(tmp_path: Path, *overrides: str) -> tuple[dict, list[dict], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "runner", *BASE, *overrides, "hydra.run.dir=run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    wall = time.monotonic() - started
    job = tmp_path / "run"
    summary = json.loads((job / "summary.json").read_text())
    # A failed job is recorded, and its run exits 1; an injected NaN's divergence is the expected outcome.
    assert done.returncode == (1 if summary["status"] == "failed" else 0), done.stdout + done.stderr
    lines = (job / "metrics.jsonl").read_text().splitlines() if (job / "metrics.jsonl").exists() else []
    summary["terminal"] = done.stdout + done.stderr  # what the user saw
    return summary, [json.loads(line) for line in lines], wall


@pytest.mark.parametrize("rank", [0, 1])
def test_raise_fails_the_job_with_that_ranks_traceback(tmp_path, rank):
    info, records, wall = run_job(tmp_path, "fault.kind=raise", f"fault.rank={rank}")
    assert info["status"] == "failed" and info["failed_rank"] == rank, info
    assert info["error"].startswith(
        f"rank {rank}: InjectedFault: fault.kind=raise injected on rank {rank} at step {FAULT_STEP}"
    )
    assert "Traceback" in info["error"] and "runner/train/fault.py" in info["error"]
    assert [r["step"] for r in records] == list(range(1, FAULT_STEP))
    assert wall < 60


def test_exit_fails_the_job_naming_the_rank_that_vanished(tmp_path):
    info, records, wall = run_job(tmp_path, "fault.kind=exit", "fault.rank=1")
    assert info["status"] == "failed" and info["failed_rank"] == 1, info
    assert info["error"].startswith("rank 1 exited with code 3 without an error record")
    assert not info["error"].rstrip().endswith(":"), info["error"]  # what follows a colon is there
    assert [r["step"] for r in records] == list(range(1, FAULT_STEP))
    assert wall < 60


def test_a_rank_killed_by_sigkill_is_named_as_the_cause_not_its_peers_reset(tmp_path):
    info, records, wall = run_job(tmp_path, "fault.kind=kill", "fault.rank=1")
    assert info["status"] == "failed" and info["failed_rank"] == 1, info
    assert info["error"].startswith("rank 1 was killed by SIGKILL (the kernel's OOM killer sends it"), info
    assert "(logs/rank1.log is empty)" in info["error"] or "its log ends:\n" in info["error"], info["error"]
    # rank 0's own failure (its peer gone) is one line on the terminal, before the launcher's root cause
    terminal = info["terminal"]
    assert "Traceback" not in terminal and "rank 0: " in terminal and "rank 1 was killed by SIGKILL" in terminal
    assert [r["step"] for r in records] == list(range(1, FAULT_STEP))
    assert wall < 60


def test_hang_ends_in_a_collective_timeout_not_at_the_job_timeout(tmp_path):
    info, records, wall = run_job(tmp_path, "fault.kind=hang", "fault.rank=1", "dist.timeout_s=10", "timeout_s=600")
    assert info["status"] == "failed" and info["failed_rank"] == 0, info  # rank 0's collective timed out
    assert "timed out" in info["error"].lower() or "timeout" in info["error"].lower(), info["error"]
    assert [r["step"] for r in records] == list(range(1, FAULT_STEP))
    assert wall < 120


def test_nan_diverges_at_that_step(tmp_path):
    info, records, _ = run_job(tmp_path, "fault.kind=nan", "fault.rank=1")
    assert info["status"] == "diverged" and info["steps_done"] == FAULT_STEP, info
    assert records[-1]["step"] == FAULT_STEP and records[-1]["grad_norm"] is None
    assert all(r["grad_norm"] is not None for r in records[:-1])
