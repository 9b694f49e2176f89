"""`python -m bench step_time`: step time of each reduction mode, and what counting collectives costs.

Runs real sweeps through `python -m runner` (W=2, grad_accum=2, tiny model,
W&B off), once with the collective counter and once without, then compares
median step times measured in this one run (the machine is noisy: compare
ratios, not absolute times). Writes bench/results.md with the command.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from analysis.load import load_sweeps

MODES = "sum,local,detached,fsdp_sum,scaled,mean_of_means"
WARMUP_STEPS = 5  # the first steps pay for allocator and thread-pool warm-up


def sweep(out: Path, steps: int, count_comm: bool) -> pd.DataFrame:
    command = [
        sys.executable, "-m", "runner", "-m", f"reduction={MODES}", "world_size=2", "grad_accum=2",
        f"train.steps={steps}", "wandb.mode=disabled", f"metrics.count_comm={str(count_comm).lower()}",
        f"hydra.sweep.dir={out}",
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True)
    loaded = load_sweeps([out])
    runs = loaded.runs
    if (runs.status != "completed").any():
        raise RuntimeError(f"a benchmark job did not complete:\n{runs[['job', 'status', 'error']]}")
    return loaded.steps[loaded.steps.step > WARMUP_STEPS].merge(runs[["run", "reduction"]], on="run")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results.md")


def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        counted = sweep(Path(tmp) / "counted", args.steps, count_comm=True)
        plain = sweep(Path(tmp) / "plain", args.steps, count_comm=False)
    table = pd.DataFrame(
        {
            "step_ms (counter off)": plain.groupby("reduction").step_time_s.median() * 1e3,
            "step_ms (counter on)": counted.groupby("reduction").step_time_s.median() * 1e3,
            "all_reduce calls/step": counted.groupby("reduction").comm_all_reduce_calls.median(),
            "all_reduce bytes/step": counted.groupby("reduction").comm_all_reduce_bytes.median(),
            "all_gather calls/step": counted.groupby("reduction").comm_all_gather_calls.median(),
            "reduce_scatter calls/step": counted.groupby("reduction").comm_reduce_scatter_calls.median(),
        }
    ).loc[MODES.split(",")]
    table.insert(1, "vs local (counter off)", table["step_ms (counter off)"] / table.loc["local", "step_ms (counter off)"])
    table.insert(3, "counter overhead", table["step_ms (counter on)"] / table["step_ms (counter off)"])
    command = f"python -m bench step_time --steps {args.steps}"
    text = "\n".join(
        [
            "# Benchmark: step time per reduction mode, and the collective counter's cost",
            "",
            f"Command: `{command}` (or `make bench`), {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.",
            f"Tiny model, W=2 gloo ranks on CPU, grad_accum=2, {args.steps} steps, median over steps > {WARMUP_STEPS}.",
            "Ratios compare runs of this one invocation; absolute times depend on the machine and its load.",
            "",
            "```",
            table.to_string(float_format=lambda v: f"{v:.3g}"),
            "```",
            "",
        ]
    )
    args.out.write_text(text)
    print(text)
