"""One launcher per job folder (`runner.sweep.folder_lock`), and no rank outliving its launcher
(`runner.world.parent_death`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from runner.sweep import folder_lock
from tests.helpers import run_module

HOLDER = """
import sys, time
from pathlib import Path
from runner.sweep import folder_lock
with folder_lock.held(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(120)
"""


def _hold(folder) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_held_folder_is_refused_naming_its_holder_and_a_dead_holders_lock_is_taken_over(tmp_path):
    holder = _hold(tmp_path / "job")
    try:
        with pytest.raises(folder_lock.FolderInUse) as refused:
            with folder_lock.held(tmp_path / "job"):
                pass
        assert f"pid {holder.pid}" in str(refused.value) and f"kill {holder.pid}" in str(refused.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with folder_lock.held(tmp_path / "job") as took_over:  # the kernel dropped the lock; the record names who held it
        assert took_over is not None and f"pid {holder.pid}" in took_over
        recorded = json.loads((tmp_path / "job" / folder_lock.LOCK).read_text())
        assert recorded["pid"] == os.getpid()
    with folder_lock.held(tmp_path / "job") as took_over:  # released in order: nothing to take over
        assert took_over is None


ARGS = ["world_size=2", "train.steps=8", "wandb.mode=disabled"]


@pytest.mark.slow
def test_a_second_launcher_on_a_running_folder_is_refused_and_the_first_run_keeps_its_own_records(tmp_path):
    first = subprocess.Popen(
        [sys.executable, "-m", "runner", *ARGS, "hydra.run.dir=D"], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    deadline = time.time() + 60
    while not (tmp_path / "D" / "config.yaml").exists() and time.time() < deadline:
        time.sleep(0.1)
    second = run_module("runner", [*ARGS, "reduction=local", "hydra.run.dir=D"], tmp_path)
    first.wait(timeout=300)
    assert second.returncode == 2, second.stdout + second.stderr
    assert f"is in use by another launcher (pid {first.pid}" in second.stdout + second.stderr
    assert first.returncode == 0
    steps = [json.loads(line)["step"] for line in (tmp_path / "D" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))  # each step once: the second launcher wrote nothing
    assert json.loads((tmp_path / "D" / "summary.json").read_text())["reduction"] == "sum"


@pytest.mark.slow
@pytest.mark.parametrize("fork_server", ["1", "0"], ids=["forked ranks", "fresh ranks"])
def test_ranks_end_with_a_launcher_killed_outright(tmp_path, fork_server):
    env = {**os.environ, "RUNNER_FORK_SERVER": fork_server}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "runner", "world_size=2", "train.steps=400", "wandb.mode=disabled", "hydra.run.dir=D"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = tmp_path / "D" / "metrics.jsonl"
    deadline = time.time() + 120
    while not (metrics.exists() and metrics.read_text().strip()) and time.time() < deadline:
        time.sleep(0.2)
    ranks = [
        int(p)
        for p in subprocess.run(
            ["pgrep", "-f", f"runner.world.worker {tmp_path}"], capture_output=True, text=True
        ).stdout.split()
    ]
    assert len(ranks) == 2, ranks
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.time() + 20
    while any(_running(pid) for pid in ranks) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_running(pid) for pid in ranks)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False
