"""B9: five reruns of the default cost job (`python -m runner experiment=cost`, what `make run` measures) in one
invocation: how often the null control holds, and how often each mode's verdict is the same class.

Goal: the null control holds in 5/5 reruns, and `sum`'s verdict class (resolved, not resolved) is the same in
at least 4/5. The reruns run one after another on this machine, each analysed by `analysis.cost.interleaved`.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pandas as pd

RERUNS = 5


def cost_job(folder: Path, number: int, quick: bool) -> tuple[Path, float]:
    job = folder / f"rerun{number}"
    quick_args = ["train.steps=15", "cost.floor_calls=20"] if quick else []
    command = [
        sys.executable,
        "-m",
        "runner",
        "experiment=cost",
        *quick_args,
        "wandb.mode=disabled",
        f"hydra.run.dir={job}",
    ]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, cwd=folder)
    return job, time.perf_counter() - started


def run(quick: bool) -> tuple[str, str, str, str]:
    from analysis.cost.interleaved import cost_table
    from analysis.report.cost import mode_cost

    tables, walls = [], []
    reruns = 2 if quick else RERUNS
    with tempfile.TemporaryDirectory() as tmp:
        for number in range(1, reruns + 1):
            job, wall = cost_job(Path(tmp), number, quick)
            frame = pd.DataFrame(
                [{"path": str(job), "job": f"rerun {number}", "world_size": 2, "sp": 1, "grad_accum": 2}]
            )
            tables.append(cost_table(frame))
            walls.append(wall)
    cost = pd.concat(tables, ignore_index=True)
    null = cost[cost["role"] == "null control"]
    null_holds = null.groupby("job")["verdict"].apply(lambda v: (v == "null: holds").all())
    modes = cost[cost["role"] == "mode"]
    classes = modes.groupby("mode")["verdict"].agg(lambda v: dict(Counter(v)))
    sum_classes = classes.get("sum", {})
    agree = max(sum_classes.values()) if sum_classes else 0
    verdict = "met" if null_holds.sum() == reruns and agree >= reruns - 1 else "not met"
    columns = ["job", "mode", "role", "steps", "ratio", "ci_low", "ci_high", "extra_ms", "extra_ci_low",
               "extra_ci_high", "p_holm", "verdict", "predicted_extra_ms"]  # fmt: skip
    sentences = "\n".join(
        f"- {row['job']}: {mode_cost(row, 'DP(2)-SP(1)-GA(2)')}" for _, row in modes[modes["mode"] == "sum"].iterrows()
    )
    body = f"""
{reruns} reruns of `python -m runner experiment=cost` (W=2, grad_accum=2, its default arms and steps), one after
another, {sum(walls):.0f} s in all ({min(walls):.0f}-{max(walls):.0f} s each), each analysed with the exact
signed-rank test (Holm-corrected within its job).

Null control holds in {int(null_holds.sum())}/{reruns} reruns. Verdict classes per mode over the reruns:
{"; ".join(f"`{mode}`: {counts}" for mode, counts in classes.items())}.
**Goal (null control {reruns}/{reruns}, `sum`'s class the same in >= {reruns - 1}/{reruns}): {verdict}.**

What the report would say of `sum` in each rerun:
{sentences}

{cost[columns].to_markdown(index=False, floatfmt=".3f")}
"""
    return (
        "B9",
        "Cost verdicts over five reruns of the default cost job",
        "python -m bench b9" + (" --quick" if quick else ""),
        body,
    )
