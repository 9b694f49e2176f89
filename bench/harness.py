"""B1: the runner's step against a bare minimal FSDP2 loop, interleaved in one world (goal: <= 1.05x).

One W-rank gloo world holds four trainers of the same model, data and
optimizer (`sum`): the runner's (`runner.train.Trainer`: sampled collective
counting, gradient sketch, world step time, JSONL and offline W&B logging on
rank 0), the same with that measurement off, and two bare loops
(`bench.bare_loop`). Every step runs the four in a fresh random order, each
after a barrier, and times each as the slowest rank's. The ratio is the
median over steps of runner / bare on the same step, with a
moving-block-bootstrap 95% CI; bare_again / bare is the null control.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

GOAL = 1.05
ARMS = ("runner", "runner_metrics_off", "bare", "bare_again")  # the columns of `measure`'s times


def measure(steps: int, world_size: int, grad_accum: int, folder: str) -> list[list[float]] | None:
    """On every rank of the world: [step][arm] world times; rank 0 returns them."""
    from bench.bare_loop import BareLoop
    from runner.layout import ParallelLayout
    from runner.metrics import MetricLogger
    from runner.parallel import build_meshes
    from runner.train import Trainer
    from runner.config import config_with
    from runner.wandb_run import start_wandb_run

    overrides = {"world_size": world_size, "grad_accum": grad_accum, "train.steps": steps, "train.log_every": 10**6}
    cfg = config_with(overrides)
    meshes = build_meshes(ParallelLayout(world_size, 1, grad_accum), "cpu")
    device = torch.device("cpu")
    logger = None
    if dist.get_rank() == 0:
        run = start_wandb_run(cfg, Path(folder), name="harness", group="bench", extra_config={})
        logger = MetricLogger(Path(folder) / "metrics.jsonl", run)
    # The runner with its measurement off (no sketch, no counting, no logging): what the rest of its step costs.
    quiet = config_with({**overrides, "metrics.sketch_dim": 0, "metrics.count_comm": False})
    # In ARMS's order:
    arms = [Trainer(cfg, meshes, device, logger), Trainer(quiet, meshes, device, None), BareLoop(cfg, meshes, device), BareLoop(cfg, meshes, device)]
    times = torch.zeros(steps, len(ARMS), dtype=torch.float64)
    for step in range(1, steps + 1):
        for index in np.random.default_rng([7, step]).permutation(len(ARMS)):
            dist.barrier()
            started = time.perf_counter()
            arms[index].step(step)
            times[step - 1, index] = time.perf_counter() - started
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    if logger is not None:
        logger.close()
    return times.tolist() if dist.get_rank() == 0 else None


def run(quick: bool) -> tuple[str, str, str]:
    from analysis.cost import paired_overheads
    from runner.local_world import run_in_world

    steps, world_size, grad_accum = (20, 2, 2) if quick else (300, 2, 2)
    with tempfile.TemporaryDirectory() as folder:
        times = run_in_world(measure, world_size, steps, world_size, grad_accum, folder, timeout_s=1800)[0]
    frame = pd.DataFrame(times, columns=list(ARMS), index=range(1, steps + 1))
    table = paired_overheads(frame, warmup_steps=5, baseline="bare").set_index("mode")
    runner, null, quiet = table.loc["runner"], table.loc["bare_again"], table.loc["runner_metrics_off"]
    null_ok = null["ci_low"] <= 1 <= null["ci_high"]
    verdict = "met" if runner["ci_high"] <= GOAL else ("not met" if runner["ci_low"] > GOAL else "not resolved")
    body = f"""
Tiny model, W={world_size} gloo ranks, grad_accum={grad_accum}, `sum`, AdamW with clipping, {steps} interleaved steps
(the first 5 left out), W&B offline, default `metrics.*` (counting on {3} first steps and every 20th).

| arm | median step ms | ratio to bare | 95% CI |
|---|---|---|---|
| bare | {frame['bare'].iloc[5:].median() * 1e3:.2f} | 1 | |
| runner | {frame['runner'].iloc[5:].median() * 1e3:.2f} | {runner['ratio']:.3f} | [{runner['ci_low']:.3f}, {runner['ci_high']:.3f}] |
| runner, metrics off (no sketch, counting or logging) | {frame['runner_metrics_off'].iloc[5:].median() * 1e3:.2f} | {quiet['ratio']:.3f} | [{quiet['ci_low']:.3f}, {quiet['ci_high']:.3f}] |
| bare_again (null control) | {frame['bare_again'].iloc[5:].median() * 1e3:.2f} | {null['ratio']:.3f} | [{null['ci_low']:.3f}, {null['ci_high']:.3f}] |

Null control {'passes' if null_ok else 'FAILS'} (its CI {'contains' if null_ok else 'excludes'} 1).
**Harness overhead: {runner['ratio']:.3f}x (95% CI [{runner['ci_low']:.3f}, {runner['ci_high']:.3f}]); goal <= {GOAL}: {verdict}.**
"""
    command = "python -m bench b1" + (" --quick" if quick else "")
    return "B1", "Harness: the runner's step vs a bare FSDP2 loop, interleaved", command, body
