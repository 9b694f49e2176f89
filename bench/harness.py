"""B1: the runner's step against a bare minimal FSDP2 loop, interleaved in one world (goal: <= 1.05x).

One W-rank gloo world holds four trainers of the same model, data and
optimizer (`sum`): the runner's (`runner.train.loop.Trainer`: sampled collective
counting, gradient sketch, world step time, JSONL and offline W&B logging on
rank 0), the same with that measurement off, and two bare loops
(`bench.bare_loop`). Every step runs the four in a fresh random order, each
after a barrier, and times each as the slowest rank's. Two ratios, each
with a moving-block-bootstrap 95% CI; bare_again / bare is the null control:
- typical step: the median over steps of runner / bare on the same step;
- whole run: total runner time / total bare time over the same steps. This
  one holds the work the runner does on some steps only (collectives counted
  on sampled steps, the world gather and rank 0's writes every
  `metrics.gather_every` steps), which a median over steps leaves out.
The goal is met when both CIs lie at or below it.
"""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

GOAL = 1.05
WARMUP_STEPS = 5  # left out of every figure
ARMS = ("runner", "runner_metrics_off", "bare", "bare_again")  # the columns of `measure`'s times


class TimedRun:
    """A wandb Run whose `log` adds up its CPU time on the calling thread (the logger's writer thread)."""

    def __init__(self, run):
        self.run, self.cpu_s = run, 0.0

    def log(self, payload: dict) -> None:
        started = time.thread_time()
        self.run.log(payload)
        self.cpu_s += time.thread_time() - started

    def finish(self) -> None:
        self.run.finish()


def measure(steps: int, world_size: int, grad_accum: int, folder: str) -> tuple[list[list[float]], float, float] | None:
    """On every rank of the world: [step][arm] world times; rank 0 returns them and the CPU seconds of
    W&B's service process and of the logger's writer thread (both run beside every arm: no arm's time holds them)."""
    from bench.bare_loop import BareLoop
    from runner.config import config_with, rank_config
    from runner.layout import ParallelLayout
    from runner.model.parallel import build_meshes
    from runner.record.metrics import MetricLogger
    from runner.record.wandb_run import start_wandb_run
    from runner.train.components import build_parts
    from runner.train.loop import Trainer

    overrides = {"world_size": world_size, "grad_accum": grad_accum, "train.steps": steps, "train.log_every": 10**6}
    cfg = rank_config(config_with(overrides))
    meshes = build_meshes(ParallelLayout(world_size, 1, grad_accum), "cpu")
    device = torch.device("cpu")
    logger = None
    if dist.get_rank() == 0:
        run = TimedRun(start_wandb_run(cfg, Path(folder), name="harness", group="bench", extra_config={}))
        logger = MetricLogger(Path(folder) / "metrics.jsonl", run, wandb_every=cfg.wandb.log_every)
    # The runner with its measurement off (no sketch, no counting, no logging): what the rest of its step costs.
    quiet = rank_config(config_with({**overrides, "metrics.sketch_dim": 0, "metrics.count_comm": False}))
    # In ARMS's order:
    arms = [
        Trainer(build_parts(cfg, meshes, device), logger),
        Trainer(build_parts(quiet, meshes, device)),
        BareLoop(cfg, meshes, device),
        BareLoop(cfg, meshes, device),
    ]
    times = torch.zeros(steps, len(ARMS), dtype=torch.float64)
    for step in range(1, steps + 1):
        for index in np.random.default_rng([7, step]).permutation(len(ARMS)):
            dist.barrier()
            started = time.perf_counter()
            arms[index].step(step)
            times[step - 1, index] = time.perf_counter() - started
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    if logger is None:
        return None
    logger.close()
    import wandb

    wandb.teardown()  # the service process ends and is reaped: its CPU time joins this rank's children's
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return times.tolist(), children.ru_utime + children.ru_stime, run.cpu_s


def whole_run_ratios(frame: pd.DataFrame, warmup_steps: int, baseline: str = "bare", seed: int = 0) -> pd.DataFrame:
    """Per arm: sum over steps of its time / the baseline's, with a 95% moving-block-bootstrap CI."""
    from analysis.cost.bootstrap import CONFIDENCE, block_length, moving_blocks

    steady = frame[frame.index > warmup_steps]
    n = len(steady)
    index = moving_blocks(n, block_length(n), np.random.default_rng(seed))
    arms = [arm for arm in steady.columns if arm != baseline]
    times, base = steady[arms].to_numpy(), steady[baseline].to_numpy()
    boot = times[index].sum(axis=1) / base[index].sum(axis=1)[:, None]  # [resample, arm]
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(boot, [tail, 100 - tail], axis=0)
    return pd.DataFrame({"ratio": times.sum(axis=0) / base.sum(), "ci_low": low, "ci_high": high}, index=arms)


def run(quick: bool) -> tuple[str, str, str]:
    from analysis.cost.bootstrap import paired_overheads
    from runner.config import MetricsConfig, WandbConfig
    from runner.testing.local_world import run_in_world

    steps, world_size, grad_accum = (20, 2, 2) if quick else (800, 2, 2)
    with tempfile.TemporaryDirectory() as folder:
        times, service_cpu_s, writer_cpu_s = run_in_world(
            measure, world_size, steps, world_size, grad_accum, folder, timeout_s=1800
        )[0]
    frame = pd.DataFrame(times, columns=list(ARMS), index=range(1, steps + 1))
    typical = paired_overheads(frame, warmup_steps=WARMUP_STEPS, baseline="bare").set_index("mode")
    whole = whole_run_ratios(frame, warmup_steps=WARMUP_STEPS)
    nulls_ok = all(t.loc["bare_again", "ci_low"] <= 1 <= t.loc["bare_again", "ci_high"] for t in (typical, whole))
    worst_high = max(typical.loc["runner", "ci_high"], whole.loc["runner", "ci_high"])
    worst_low = max(typical.loc["runner", "ci_low"], whole.loc["runner", "ci_low"])
    verdict = "met" if worst_high <= GOAL else ("not met" if worst_low > GOAL else "not resolved")
    labels = {
        "runner": "runner",
        "runner_metrics_off": "runner, metrics off (no sketch, counting or logging)",
        "bare_again": "bare_again (null control)",
    }
    steady = frame[frame.index > WARMUP_STEPS]

    def cells(table: pd.DataFrame, arm: str) -> str:
        return f"{table.loc[arm, 'ratio']:.3f} [{table.loc[arm, 'ci_low']:.3f}, {table.loc[arm, 'ci_high']:.3f}]"

    rows = "\n".join(
        f"| {labels[arm]} | {steady[arm].median() * 1e3:.2f} | {steady[arm].mean() * 1e3:.2f} | {cells(typical, arm)} | {cells(whole, arm)} |"
        for arm in ("runner", "runner_metrics_off", "bare_again")
    )
    cfg_defaults = MetricsConfig()
    outside_share = (service_cpu_s + writer_cpu_s) / steady["bare"].sum()
    body = f"""
Tiny model, W={world_size} gloo ranks, grad_accum={grad_accum}, `sum`, AdamW with clipping, {steps} interleaved steps
(the first {WARMUP_STEPS} left out), W&B offline, charting every {WandbConfig().log_every}th step (`wandb.log_every`), default `metrics.*`
(collectives counted on the first {cfg_defaults.count_first} steps and every {cfg_defaults.count_every}th, the world gathered every
{cfg_defaults.gather_every} steps).
Ratios to bare with 95% CIs: typical step = median over steps of the paired ratio;
whole run = total time over total time (it holds what the runner does on some steps only).

| arm | median step ms | mean step ms | typical step | whole run |
|---|---|---|---|---|
| bare | {steady["bare"].median() * 1e3:.2f} | {steady["bare"].mean() * 1e3:.2f} | 1 | 1 |
{rows}

W&B's work runs beside all four arms, so no ratio above holds it: its service process used {service_cpu_s:.2f} s of CPU
(its start-up included) and the logger's writer thread {writer_cpu_s:.2f} s, together {outside_share * 100:.1f}% of the bare
arm's total time. Counted in full as the runner's time (as on a machine with no idle core), the whole-run ratio
would be {whole.loc["runner", "ratio"] + outside_share:.3f}.

Null control {"passes" if nulls_ok else "FAILS"} (both its CIs {"contain" if nulls_ok else "do not both contain"} 1).
**Harness overhead: typical step {cells(typical, "runner")}, whole run {cells(whole, "runner")}; goal <= {GOAL}
(both CIs at or below it): {verdict}.**
"""
    command = "python -m bench b1" + (" --quick" if quick else "")
    return "B1", "Harness: the runner's step vs a bare FSDP2 loop, interleaved", command, body
