"""B3: what `sum` (and `detached`) cost over `local` at W=2, grad_accum 1 and 4, against the floor.

Each grad_accum is one interleaved cost job (`runner.measure.cost`, `experiment=cost`):
every step runs sum, local, detached, fsdp_sum and scaled on the same
micro-batches in a random order, each after a barrier. The figures are
`analysis.cost.interleaved`'s: Hodges-Lehmann shifts against local on the same steps with the
95% CIs of the exact signed-rank test, Holm-corrected verdicts, the null control
(fsdp_sum, scaled), and the floor's prediction.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

MODES = "[sum,local,detached,fsdp_sum,scaled]"


def cost_job(folder: Path, grad_accum: int, steps: int, floor_calls: int) -> Path:
    job = folder / f"ga{grad_accum}"
    command = [
        sys.executable, "-m", "runner", "experiment=cost", f"grad_accum={grad_accum}", f"cost.modes={MODES}",
        f"train.steps={steps}", f"cost.floor_calls={floor_calls}", "wandb.mode=disabled", f"hydra.run.dir={job}",
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, cwd=folder)
    return job


def run(quick: bool) -> tuple[str, str, str]:
    from analysis.cost.interleaved import cost_table, floor_table

    steps, floor_calls = (12, 50) if quick else (200, 1000)
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [
            {
                "path": str(cost_job(Path(tmp), ga, steps, floor_calls)),
                "job": f"GA={ga}",
                "world_size": 2,
                "sp": 1,
                "grad_accum": ga,
                "cost.warmup_steps": 5,
            }
            for ga in (1, 4)
        ]
        frame = pd.DataFrame(jobs)
        cost, floor = cost_table(frame), floor_table(frame)
    columns = [
        "job",
        "mode",
        "role",
        "local_ms",
        "ratio",
        "ci_low",
        "ci_high",
        "extra_ms",
        "extra_ci_low",
        "extra_ci_high",
        "p_holm",
        "verdict",
        "extra_calls",
        "predicted_extra_ms",
        "floor_explains",
    ]
    body = f"""
Tiny model, W=2 gloo ranks, `experiment=cost` with cost.modes={MODES}, {steps} steps per job (the first 5 left
out), one job per grad_accum. ratio and extra (ms): the Hodges-Lehmann shifts of the mode's forward+backward time
against `local`'s on the same steps; CIs: 95%, inverting the exact signed-rank test; verdicts Holm-corrected within
each job. The floor predicts `extra calls x floor median`.

{cost[columns].to_markdown(index=False, floatfmt=".3f")}

Floor (scalar all-reduce after a barrier, slowest rank, {floor_calls} calls per kind):

{floor.to_markdown(index=False, floatfmt=".3f")}
"""
    return (
        "B3",
        "Overhead of sum vs local (interleaved), against the floor",
        "python -m bench b3" + (" --quick" if quick else ""),
        body,
    )
