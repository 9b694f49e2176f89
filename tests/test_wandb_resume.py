"""A checkpointing job keeps one W&B run across the attempts that resume it; a job that starts anew gets a new one.

The job runs offline (no network here) and is stopped past its first checkpoint, as in tests/test_resume.py
(SIGKILL to its process group, or SIGTERM to the launcher), then rerun. Each attempt writes its own offline
run folder, named by the run id; W&B's own reader of the transaction log (`wandb leet inspect --json`) gives
a folder's run record and history: the same run id, the resumed attempt's marked `resume` (what `wandb sync`
appends by), and the steps each attempt logged. Online resume (the same id with resume="allow", W&B's server
continuing the run) needs W&B's server: not tested here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_resume import finished, run

from analysis.load.sweeps import load_sweeps
from runner.record import checkpoints
from runner.record.summary import read_summary
from runner.record.wandb_run import RUN_ID_FILE, checkpointed_run_id

STEPS = 12
OFFLINE = [
    f"train.steps={STEPS}",
    "train.checkpoint_every=3",
    "train.global_batch=8",
    "train.seq_len=32",
    "world_size=2",
    "wandb.mode=offline",
    "wandb.log_every=1",  # every step charted: the history shows exactly which steps each attempt logged
]


def transaction_log(run_dir: Path) -> list[dict]:
    """The records of an offline run folder's .wandb file, read by W&B's own CLI."""
    wandb = shutil.which("wandb", path=str(Path(sys.executable).parent))
    out = subprocess.run(
        [wandb, "leet", "inspect", "--json", str(run_dir)], capture_output=True, text=True, check=True
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def run_record(records: list[dict]) -> dict:
    return next(record["run"] for record in records if record["type"] == "run")


def logged_steps(records: list[dict]) -> list[int]:
    return [record["history"]["item"]["step"] for record in records if record["type"] == "history"]


def offline_runs(job: Path) -> list[Path]:
    """The job's offline run folders, oldest first (their names start with their start time)."""
    return sorted(job.glob("wandb/offline-run-*"))


def test_a_resumed_attempt_reads_the_run_id_back_and_any_other_draws_a_new_one(tmp_path):
    first = checkpointed_run_id(tmp_path, resumes=False)
    assert (checkpoints.checkpoints_dir(tmp_path) / RUN_ID_FILE).read_text().strip() == first
    assert checkpointed_run_id(tmp_path, resumes=True) == first
    again = checkpointed_run_id(tmp_path, resumes=False)  # a job run again from step 1 is another run
    assert again != first and checkpointed_run_id(tmp_path, resumes=True) == again
    fresh = tmp_path / "no-id-written"  # checkpoints of an attempt that wrote no id: a new run, written down
    resumed_without = checkpointed_run_id(fresh, resumes=True)
    assert resumed_without not in (first, again) and checkpointed_run_id(fresh, resumes=True) == resumed_without


def stop_past_first_checkpoint(args: list[str], tmp_path: Path, job: Path, how: str) -> None:
    """Start the job, and once a checkpoint is complete, SIGKILL its whole process group (nothing of it records
    anything, W&B's service included) or SIGTERM the launcher (the ranks save the step they are in and stop)."""
    victim = run(args, tmp_path)
    deadline = time.time() + 600
    while checkpoints.newest_complete(job) is None and victim.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert checkpoints.newest_complete(job) is not None, "no checkpoint before the job ended"
    if how == "SIGKILL":
        os.killpg(victim.pid, signal.SIGKILL)
    else:
        victim.send_signal(signal.SIGTERM)
    victim.communicate(timeout=600)
    assert (read_summary(job) or {}).get("status") != "completed", "the job completed before the signal"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_job_stopped_past_a_checkpoint_and_rerun_continues_its_offline_wandb_run(tmp_path, how):
    job = tmp_path / "job"
    stop_past_first_checkpoint([*OFFLINE, "hydra.run.dir=job"], tmp_path, job, how)
    out = finished(run([*OFFLINE, "hydra.run.dir=job"], tmp_path))
    resumed_from = read_summary(job)["resumed_from_step"]
    assert f"resumes from its newest complete checkpoint, step {resumed_from}" in out, out

    first_dir, resumed_dir = offline_runs(job)  # one folder per attempt, no more
    run_id = read_summary(job)["wandb_run_id"]
    for folder in (first_dir, resumed_dir):  # W&B names both by the run id: offline-run-<time>-<id>/run-<id>.wandb
        assert folder.name.endswith(f"-{run_id}") and (folder / f"run-{run_id}.wandb").is_file()
    resumed = transaction_log(resumed_dir)
    assert run_record(resumed)["run_id"] == run_id and run_record(resumed)["resume"] is True
    assert logged_steps(resumed) == list(range(resumed_from + 1, STEPS + 1))  # from the checkpoint's next step
    first = transaction_log(first_dir)
    if how == "SIGTERM":  # W&B finished the first attempt's run: its log is whole, and the two hold each step once
        assert run_record(first)["run_id"] == run_id and not run_record(first).get("resume")
        assert logged_steps(first) == list(range(1, resumed_from + 1))
        assert load_sweeps([tmp_path]).runs.set_index("job").loc["job", "wandb_run_id"] == run_id  # the analysis'
    else:  # offline, W&B's service writes its log in 32 KiB blocks and loses the unwritten one when killed
        assert all(record["type"] == "header" for record in first) or run_record(first)["run_id"] == run_id

        # Rerun with another identity: another run, started at step 1 (the attempt moves aside), with a new id.
        out = finished(run([*OFFLINE, "seed=1", "hydra.run.dir=job"], tmp_path))  # (train.steps would continue)
        assert "resumes from" not in out and "resumed_from_step" not in read_summary(job), out
        again = read_summary(job)["wandb_run_id"]
        assert again != run_id and [folder.name.endswith(f"-{again}") for folder in offline_runs(job)] == [True]
