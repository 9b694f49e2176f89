"""B5: a newcomer's first `make run`, setup included, from a fresh clone (goal <= 150 s on 2 cores).

Clones the repository's HEAD into a temporary folder and runs, there, `make setup` and then each command of
the Makefile's own `run` recipe (as `make -n run` prints it: the six-mode sweep, the interleaved cost job,
the analysis), timing each; their sum is what `make run` takes on a fresh clone.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

GOAL_S = 150.0
ROOT = Path(__file__).resolve().parents[1]
PHASES = {"-m runner -m": "sweep", "experiment=cost": "cost job", "-m analysis": "analysis"}


def _timed(command: list[str] | str, cwd: Path, env: dict) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, shell=isinstance(command, str))
    wall = time.perf_counter() - started
    if done.returncode and "-m runner" not in str(command):  # the recipe ignores the runner's exit codes
        raise RuntimeError(f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return wall, done.stdout


def run(quick: bool) -> tuple[str, str, str, str]:
    args = ["ARGS=train.steps=6 wandb.mode=disabled"] if quick else []
    # As make runs the recipe: the Makefile unexports PYTHONDONTWRITEBYTECODE (so that the first import writes
    # the byte code uv does not), and the commands are run here outside make.
    dropped = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE")
    env = {key: value for key, value in os.environ.items() if key not in dropped}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        clone = Path(folder) / "clone"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True)
        times = {"setup": _timed(["make", "setup"], clone, env)[0]}
        recipe = subprocess.run(["make", "-n", "run", *args], cwd=clone, env=env, capture_output=True, text=True)
        last = ""
        for line in recipe.stdout.splitlines():
            phase = next((name for marker, name in PHASES.items() if marker in line), None)
            if phase is not None:
                times[phase], out = _timed(line, clone, env)
                last = out.strip().splitlines()[-1] if out.strip() else last
    wall = sum(times.values())
    rows = "\n".join(f"| {phase} | {seconds:.1f} |" for phase, seconds in times.items())
    body = f"""
A fresh clone of HEAD ({head.stdout.strip()}), `make setup` (a new virtual environment: uv, torch from the local
wheel, the package), then the `run` recipe's commands {" ".join(args)}: the default sweep (six modes, W=2, GA=2,
60 steps), `experiment=cost` (225 interleaved steps of sum, local, detached and fsdp_sum) into the same sweep,
and its analysis. Load average at the start: {load:.1f}.

| phase | s |
|---|---|
{rows}

**Wall time: {wall:.0f} s (goal <= {GOAL_S:.0f} s: {"met" if wall <= GOAL_S else "NOT met"}).** Last line: `{last}`
"""
    return "B5", "make run on a fresh clone, setup included", "python -m bench b5" + (" --quick" if quick else ""), body
