"""SIGTERM or SIGINT to a sweep: every rank stops, the running job is recorded as interrupted with its
metrics kept, and a rerun into the same sweep directory finishes only what did not complete."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

LONG_STEPS = 120


def rank_processes(marker: str) -> list[str]:
    table = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in table.splitlines() if "runner.world.worker" in line and marker in line]


def job_dirs(sweep: Path) -> dict[int, Path]:
    return {int(p.name.split("_")[0]): p for p in sweep.iterdir() if p.is_dir() and p.name[0].isdigit()}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_every_rank_and_a_rerun_finishes_the_rest(tmp_path, sig):
    sweep = tmp_path / "sweep"
    command = [
        sys.executable,
        "-m",
        "runner",
        "-m",
        "reduction=sum",
        f"train.steps=3,{LONG_STEPS}",
        "world_size=2",
        "wandb.mode=disabled",
        "metrics.sketch_dim=0",
        f"hydra.sweep.dir={sweep}",
    ]
    runner = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # until the long job (#1) has logged a few steps
        metrics = job_dirs(sweep)[1] / "metrics.jsonl" if sweep.exists() and 1 in job_dirs(sweep) else None
        if metrics is not None and metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    else:
        runner.kill()
        pytest.fail("the long job never started: " + runner.communicate()[0])
    runner.send_signal(sig)
    output = runner.communicate(timeout=60)[0]
    assert runner.returncode == 128 + sig, output  # as a shell reports a process the signal stopped
    assert "Traceback" not in output and f"sweep interrupted by {sig.name}: completed 1, failed 1" in output, output
    time.sleep(0.5)
    assert rank_processes(str(sweep)) == []  # no orphan rank
    jobs = job_dirs(sweep)
    first, second = (json.loads((jobs[n] / "summary.json").read_text()) for n in (0, 1))
    assert first["status"] == "completed"
    assert second["status"] == "failed" and second["interrupted"] and second["error"].startswith("interrupted"), second
    assert second["stopped_by"] == sig.name and second.get("ranks_stopped_by") in (None, "SIGTERM"), second
    kept = [json.loads(line) for line in (jobs[1] / "metrics.jsonl").read_text().splitlines()]
    assert len(kept) >= 3 and [r["step"] for r in kept] == list(range(1, len(kept) + 1))

    rerun = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "skipped, completed earlier" in rerun.stdout + rerun.stderr  # job 0 was not run again
    again = json.loads((jobs[1] / "summary.json").read_text())
    assert again["status"] == "completed" and again["steps_done"] == LONG_STEPS


def test_a_second_sigint_right_after_the_first_cannot_lose_the_record(tmp_path):
    """Ctrl-C pressed twice: the job still ends with its summary.json, and no traceback."""
    command = [sys.executable, "-m", "runner", f"train.steps={LONG_STEPS}", "wandb.mode=disabled", "hydra.run.dir=run"]
    runner = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and metrics.read_text().count("\n") >= 1) and time.monotonic() < deadline:
        time.sleep(0.1)
    runner.send_signal(signal.SIGINT)
    time.sleep(0.02)
    runner.send_signal(signal.SIGINT)
    output = runner.communicate(timeout=60)[0]
    assert runner.returncode == 130, output
    assert "Traceback" not in output and "run interrupted by SIGINT" in output, output
    info = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert info["status"] == "failed" and info["interrupted"] and "recorded step(s), which are kept" in info["error"]
    assert rank_processes(str(tmp_path)) == []


def test_the_first_signal_to_arrive_decides_even_when_both_land_in_one_c_call(tmp_path):
    # CPython would run SIGINT's handler first (by number) when SIGTERM came first during one long C call.
    script = (
        "import hashlib, sys, time\n"
        "from runner.sweep import interrupts\n"
        "interrupts.hold_for_good()\n"
        "print('ready', flush=True)\n"
        "hashlib.pbkdf2_hmac('sha256', b'x', b'y', 3_000_000)\n"  # one C call of about a second
        "print(interrupts.first_signal(), flush=True)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    time.sleep(0.1)
    child.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=120)
    assert out.strip() == str(int(signal.SIGTERM))
