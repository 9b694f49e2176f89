"""A job killed past a checkpoint, then rerun, resumes from its newest complete checkpoint and ends as the
uninterrupted job does, bit for bit; a checkpoint cut off mid-write is never loaded.

The kill is SIGKILL to the launcher's whole process group (its ranks too) at a random moment after the first
checkpoint is complete: nothing of the job gets to record anything, as when a node dies or SLURM's kill lands.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.record import checkpoints
from runner.record.summary import read_summary

# What a step computes (its timings are the machine's): the resumed run's must equal the uninterrupted run's.
COMPUTED = ("step", "tokens", "valid_tokens", "loss", "reported_loss", "grad_norm", "clip_coef", "lr", "grad_sketch")
QUICK = [
    "train.steps=12",
    "train.checkpoint_every=2",
    "train.global_batch=8",
    "train.seq_len=32",
    "wandb.mode=disabled",
]


def records(job: Path) -> list[dict]:
    return [
        {key: json.loads(line)[key] for key in COMPUTED} for line in (job / "metrics.jsonl").read_text().splitlines()
    ]


def test_only_a_complete_checkpoint_is_found_and_the_newest_are_kept(tmp_path):
    for step in (2, 4, 6):
        checkpoints.partial_dir(tmp_path, step).mkdir(parents=True)
        checkpoints.publish(tmp_path, step, {"layout": "DP(2)-SP(1)-GA(2)"}, keep=2)
    assert [step for step, _ in checkpoints.complete(tmp_path)] == [4, 6]
    checkpoints.partial_dir(tmp_path, 8).mkdir()  # cut off before its meta.json
    (checkpoints.checkpoints_dir(tmp_path) / checkpoints.name_of(10)).mkdir()  # a step folder without meta.json
    torn = checkpoints.checkpoints_dir(tmp_path) / checkpoints.name_of(12)
    torn.mkdir()
    (torn / checkpoints.META).write_text('{"step": 1')  # a meta.json cut off mid-write
    assert checkpoints.newest_complete(tmp_path)[0] == 6
    checkpoints.remove_partial(tmp_path)
    assert not checkpoints.partial_dir(tmp_path, 8).exists()


def test_the_records_after_the_checkpoint_are_cut_and_a_torn_line_with_them(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 6)) + '{"step": 6, "lo')
    assert checkpoints.truncate_metrics(path, 3) == 3
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2)) + '{"step": 3, "lo')
    assert checkpoints.truncate_metrics(path, 4) == 2  # the torn line goes, whatever its step


def run(args: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "runner", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the kill reaches the ranks too
        **kwargs,
    )


def finished(process: subprocess.Popen) -> str:
    out, _ = process.communicate(timeout=900)
    assert process.returncode == 0, out
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout",
    [["world_size=2", "grad_accum=2"], ["world_size=4", "sp=2", "grad_accum=1"]],
    ids=["W2-GA2", "W4-SP2"],
)
def test_a_job_killed_past_a_checkpoint_resumes_and_ends_bit_identical(tmp_path, layout):
    whole = run([*QUICK, *layout, "hydra.run.dir=whole"], tmp_path)
    finished(whole)
    args = [*QUICK, *layout, "hydra.run.dir=killed"]
    job = tmp_path / "killed"
    victim = run(args, tmp_path)
    deadline = time.time() + 600
    while checkpoints.newest_complete(job) is None and victim.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert checkpoints.newest_complete(job) is not None, "no checkpoint before the job ended"
    wait_for_step(job, victim, random.Random(os.getpid()).randint(5, 8))  # past two checkpoints (2 and 4 or later)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate()
    summary = read_summary(job) or {}
    assert summary.get("status") != "completed", "the job completed before the kill: nothing to resume"
    (older, _), (newest, newest_dir) = checkpoints.complete(job)[-2:]
    # What a kill mid-write leaves, and worse: none of it may be loaded.
    checkpoints.partial_dir(job, newest + 1).mkdir()
    (checkpoints.partial_dir(job, newest + 1) / "rank0.pt").write_bytes(b"half a file")
    (checkpoints.checkpoints_dir(job) / checkpoints.name_of(newest + 3)).mkdir()
    # A complete checkpoint whose shard file was cut short (a disk that filled up): passed over for the older one.
    shard = newest_dir / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])

    out = finished(run(args, tmp_path))
    assert f"resumes from its newest complete checkpoint, step {newest}" in out, out
    assert f"checkpoint {checkpoints.name_of(newest)} cannot be loaded (__1_0.distcp holds " in out, out
    assert f"passed over; resuming from step {older}" in out, out
    assert read_summary(job)["resumed_from_step"] == older
    assert records(job) == records(tmp_path / "whole")  # every step once, each as the uninterrupted run's
    assert read_summary(job)["final_state_sha256"] == read_summary(tmp_path / "whole")["final_state_sha256"]
    assert not checkpoints.partial_dir(job, newest + 1).exists()


@pytest.mark.slow
def test_a_rerun_after_a_completed_checkpointed_job_skips_it_and_another_layout_starts_anew(tmp_path):
    finished(run([*QUICK, "world_size=2", "hydra.run.dir=job"], tmp_path))
    summary = read_summary(tmp_path / "job")
    assert "resumed_from_step" not in summary and summary["status"] == "completed"
    assert "skipped, completed earlier" in finished(run([*QUICK, "world_size=2", "hydra.run.dir=job"], tmp_path))
    # Killed, then rerun at another world size: another run (its identity differs), never a resume.
    summary_path = tmp_path / "job" / "summary.json"
    summary_path.write_text(json.dumps({**summary, "status": "failed"}))
    out = finished(run([*QUICK, "world_size=1", "hydra.run.dir=job"], tmp_path))
    assert "resumes from" not in out and "held an earlier run of another identity" in out, out
    assert "resumed_from_step" not in read_summary(tmp_path / "job")


def wait_for_step(job: Path, victim: subprocess.Popen, step: int) -> None:
    """Until `step` records are in metrics.jsonl (a step picked at random, not a time: however fast the steps)."""
    metrics, deadline = job / "metrics.jsonl", time.time() + 600
    while victim.poll() is None and time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= step:
            return
        time.sleep(0.01)


def rank_pids(job: Path) -> list[int]:
    """The job's rank processes (their command line, or process title, names the job folder), in the order they
    started: rank 0 first (the spawner starts them in rank order)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").split()
            started = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[19])
        except (OSError, IndexError, ValueError):  # not a process, or gone
            continue
        if "runner.world.worker" in command and str(job) in command:
            found.append((started, int(proc.name)))
    return [pid for _, pid in sorted(found)]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM to the launcher", "SIGUSR1 to rank 0 alone"])
def test_a_stop_signal_saves_the_step_every_rank_agrees_on_and_the_rerun_resumes_there(tmp_path, how):
    """No periodic checkpoint falls inside the run (checkpoint_every=1000): the one it resumes from is the one
    the signal made. SIGTERM is what Ctrl-C, a timeout and SLURM's kill send; SIGUSR1 what SLURM sends ahead
    of a time limit (to submitit's rank 0 only, under the slurm preset)."""
    quick = ["train.steps=40", "train.checkpoint_every=1000", *QUICK[2:], "world_size=2"]
    finished(run([*quick, "hydra.run.dir=whole"], tmp_path))
    job = tmp_path / "stopped"
    victim = run([*quick, "hydra.run.dir=stopped"], tmp_path)
    deadline = time.time() + 600
    metrics = job / "metrics.jsonl"
    while not (metrics.exists() and metrics.read_text()) and victim.poll() is None and time.time() < deadline:
        time.sleep(0.05)  # until the first records are written: training is under way
    wait_for_step(job, victim, random.Random(os.getpid()).randint(1, 25))
    if how.startswith("SIGTERM"):
        victim.send_signal(signal.SIGTERM)
    else:
        os.kill(rank_pids(job)[0], signal.SIGUSR1)
    out, _ = victim.communicate(timeout=600)
    summary = read_summary(job)
    newest = checkpoints.newest_complete(job)
    assert newest is not None, out
    stopped_at = newest[0]
    assert summary["stopped_by"] == ("SIGTERM" if how.startswith("SIGTERM") else "SIGUSR1"), out
    assert summary["steps_done"] == stopped_at < 40
    assert [r["step"] for r in records(job)] == list(range(1, stopped_at + 1))  # every step up to it, once
    if how.startswith("SIGTERM"):
        assert f"a rerun into this directory resumes from its checkpoint of step {stopped_at}" in summary["error"]

    again = finished(run([*quick, "hydra.run.dir=stopped"], tmp_path))
    assert f"resumes from its newest complete checkpoint, step {stopped_at}" in again
    assert records(job) == records(tmp_path / "whole")
    assert read_summary(job)["final_state_sha256"] == read_summary(tmp_path / "whole")["final_state_sha256"]


@pytest.mark.slow
def test_a_completed_run_given_more_steps_continues_from_its_checkpoint_bit_identical(tmp_path):
    """train.steps changes no step's computation: a completed 12-step run rerun with train.steps=16 continues
    from its newest checkpoint (step 10: the last step keeps none) and ends as a 16-step run from scratch does;
    with fewer steps than its newest checkpoint it is another run, superseded."""
    longer = [f"train.steps={16}", *QUICK[1:], "world_size=2"]
    finished(run([*longer, "hydra.run.dir=whole"], tmp_path))
    finished(run([*QUICK, "world_size=2", "hydra.run.dir=grown"], tmp_path))
    assert checkpoints.newest_complete(tmp_path / "grown")[0] == 10
    out = finished(run([*longer, "hydra.run.dir=grown"], tmp_path))
    assert "resumes from its newest complete checkpoint, step 10 (an attempt of other train.steps: 12 -> 16;" in out
    summary = read_summary(tmp_path / "grown")
    assert summary["resumed_from_step"] == 10 and summary["status"] == "completed"
    assert records(tmp_path / "grown") == records(tmp_path / "whole")  # every step once, each as the 16-step run's
    assert summary["final_state_sha256"] == read_summary(tmp_path / "whole")["final_state_sha256"]

    out = finished(run([*QUICK[1:], "train.steps=9", "world_size=2", "hydra.run.dir=grown"], tmp_path))
    assert "held an earlier run of another identity" in out and "train.steps: 16 -> 9" in out
