"""B2: a job's fixed cost (wall time minus training) against a trivial torchrun job of the same W (goal <= 1.5x).

Rounds alternate the two (trivial, runner, trivial, runner, ...), so a change
in machine load hits both; the ratio is the median over rounds of the paired
ratio. The runner's job is `python -m runner train.steps=1` (W=2, W&B
offline, as `make run`'s jobs); its fixed cost is the whole command's wall
time minus summary.json's `train` phase, split by summary.json into the
launcher's spawn, imports, process group, W&B init and teardown; the rest is
the parent's start (Python, Hydra, config, validation) and its wait for the ranks.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

GOAL = 1.5


def timed(command: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:  # the job's own words, not only its exit status
        raise RuntimeError(
            f"{' '.join(command[1:])} exited with {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    return time.perf_counter() - started


def runner_job(folder: Path, name: str) -> tuple[float, dict[str, float]]:
    """Run `python -m runner train.steps=1` in folder/name: (its fixed cost in s, that cost split into parts)."""
    job = folder / name
    wall = timed([sys.executable, "-m", "runner", "train.steps=1", f"hydra.run.dir={job}"], folder)
    summary = json.loads((job / "summary.json").read_text())
    fixed = wall - summary["wall_s"]["train"]
    parts = {"spawn": summary["wall_s"]["launch"], **summary["init_s"], "teardown": summary["wall_s"]["teardown"]}
    parts["parent and wait"] = fixed - sum(parts.values())
    return fixed, parts


def run(quick: bool) -> tuple[str, str, str, str]:
    rounds = 2 if quick else 7
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    trivial = [torchrun, "--standalone", "--nproc-per-node=2", str(Path(__file__).with_name("trivial_rank.py"))]
    trivial_s, fixed_s, splits = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(rounds):
            trivial_s.append(timed(trivial, Path(tmp)))
            fixed, parts = runner_job(Path(tmp), f"job{index}")
            fixed_s.append(fixed)
            splits.append(parts)
    ratios = np.array(fixed_s) / np.array(trivial_s)
    ratio = float(np.median(ratios))
    split_rows = "\n".join(f"| {name} | {np.median([s[name] for s in splits]):.2f} |" for name in splits[0])
    body = f"""
{rounds} rounds, each a trivial torchrun job (`bench/trivial_rank.py`: import torch, gloo init, barrier, destroy)
then `python -m runner train.steps=1` (W=2, tiny, W&B offline).

| | median s |
|---|---|
| trivial torchrun job | {np.median(trivial_s):.2f} |
| runner job, wall minus training | {np.median(fixed_s):.2f} |

The runner's fixed cost, split (median s; imports, process group and W&B are rank 0's):

| part | s |
|---|---|
{split_rows}

**Fixed cost: {ratio:.2f}x the trivial job (paired per round; range {ratios.min():.2f} to {ratios.max():.2f}); goal <= {GOAL}:
{"met" if ratio <= GOAL else "NOT met"}.**
"""
    return (
        "B2",
        "Per-job fixed cost vs a trivial torchrun job",
        "python -m bench b2" + (" --quick" if quick else ""),
        body,
    )
