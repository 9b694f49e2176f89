"""B5: `make run` end to end with setup already done (goal <= 180 s on 2 cores).

Runs the Makefile's own `run` target (the six-mode sweep, the interleaved cost
job and the analysis) in the repository, as a newcomer would, and times it.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

GOAL_S = 180.0
ROOT = Path(__file__).resolve().parents[1]


def run(quick: bool) -> tuple[str, str, str]:
    args = ["ARGS=train.steps=6 wandb.mode=disabled"] if quick else []
    started = time.perf_counter()
    done = subprocess.run(["make", "run", *args], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"make run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    sweep = done.stdout.strip().splitlines()[-1]
    body = f"""
`make run` {" ".join(args)} in the repository, setup already done: the default sweep (six modes, W=2, GA=2, 60 steps),
then `experiment=cost` (225 interleaved steps of sum, local, detached and fsdp_sum) into the same sweep, then its
analysis.

**Wall time: {wall:.0f} s (goal <= {GOAL_S:.0f} s: {"met" if wall <= GOAL_S else "NOT met"}).** Last line: `{sweep}`
"""
    return "B5", "make run end to end", "python -m bench b5" + (" --quick" if quick else ""), body
