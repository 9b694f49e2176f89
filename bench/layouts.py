"""B12: a training step at DP(2)-TP(2) and at DP(2)-PP(2) against DP(4), interleaved in one world of 4 ranks.

The same model, data, optimizer (`sum`, AdamW with clipping) and global batch in every arm; only the layout
differs. One 4-rank gloo world holds a runner `Trainer` per arm (`runner.train.loop.Trainer`, measurement
off: no sketch, no counting, no logging), each on its own meshes: DP(4), DP(4) again (the null control),
DP(2)-TP(2) and DP(2)-PP(2) (GPipe, K = 2 pipeline micro-batches per micro-batch). Every step runs the arms
in a fresh random order, each after a barrier, and times each as the slowest rank's. Per arm: the median
over steps of its time / DP(4)'s on the same step, with a moving-block-bootstrap 95% CI
(`analysis.cost.bootstrap.paired_overheads`). A ratio is reported as resolved where its CI excludes 1 and
the null control's contains it.

On 2 CPU cores the 4 ranks share the cores, so these ratios say what tp's and pp's extra collectives and
the pipeline's bubble cost on this machine, not on a GPU cluster.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

WARMUP_STEPS = 5  # left out of every figure
WORLD = 4
# (name, config overrides): in the order of `measure`'s columns.
ARMS = (
    ("DP(4)", {}),
    ("DP(4) again", {}),
    ("DP(2)-TP(2)", {"tp": 2}),
    ("DP(2)-PP(2)", {"pp": 2}),
)


def measure(steps: int, grad_accum: int) -> list[list[float]] | None:
    """On every rank: [step][arm] world times; rank 0 returns them."""
    from runner.config import config_with, rank_config
    from runner.layout import ParallelLayout
    from runner.model.parallel import build_meshes
    from runner.train.components import build_parts
    from runner.train.loop import Trainer

    base = {
        "world_size": WORLD,
        "grad_accum": grad_accum,
        "train.steps": steps,
        "metrics.sketch_dim": 0,
        "metrics.count_comm": False,
    }
    device = torch.device("cpu")
    trainers = []
    for _, overrides in ARMS:
        cfg = rank_config(config_with({**base, **overrides}))
        meshes = build_meshes(ParallelLayout.from_config(cfg), "cpu")
        trainers.append(Trainer(build_parts(cfg, meshes, device)))
    times = torch.zeros(steps, len(ARMS), dtype=torch.float64)
    for step in range(1, steps + 1):
        for index in np.random.default_rng([12, step]).permutation(len(ARMS)):
            dist.barrier()
            started = time.perf_counter()
            trainers[index].step(step)
            times[step - 1, index] = time.perf_counter() - started
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return times.tolist() if dist.get_rank() == 0 else None


def run(quick: bool) -> tuple[str, str, str]:
    from analysis.cost.bootstrap import paired_overheads
    from runner.testing.local_world import run_in_world

    steps, grad_accum = (12, 2) if quick else (300, 2)
    names = [name for name, _ in ARMS]
    times = run_in_world(measure, WORLD, steps, grad_accum, timeout_s=1800)[0]
    frame = pd.DataFrame(times, columns=names, index=range(1, steps + 1))
    ratios = paired_overheads(frame, warmup_steps=WARMUP_STEPS, baseline="DP(4)").set_index("mode")
    steady = frame[frame.index > WARMUP_STEPS]
    null = ratios.loc["DP(4) again"]
    null_ok = null["ci_low"] <= 1 <= null["ci_high"]

    def verdict(arm: str) -> str:
        row = ratios.loc[arm]
        if arm == "DP(4) again":
            return "null control: " + ("passes" if null_ok else "FAILS")
        if not null_ok or row["ci_low"] <= 1 <= row["ci_high"]:
            return "not resolved"
        return "slower" if row["ci_low"] > 1 else "faster"

    rows = "\n".join(
        f"| {arm} | {steady[arm].median() * 1e3:.1f} | {ratios.loc[arm, 'ratio']:.3f} "
        f"[{ratios.loc[arm, 'ci_low']:.3f}, {ratios.loc[arm, 'ci_high']:.3f}] | {verdict(arm)} |"
        for arm in names[1:]
    )
    body = f"""
Tiny model, W={WORLD} gloo ranks on this machine's cores, grad_accum={grad_accum}, the same global batch in every
arm, `sum`, AdamW with clipping, measurement off; {steps} interleaved steps (the first {WARMUP_STEPS} left out).
Ratio = median over steps of the arm's step time / DP(4)'s on the same step, with a 95% moving-block-bootstrap CI.

| arm | median step ms | ratio to DP(4) | verdict |
|---|---|---|---|
| DP(4) | {steady["DP(4)"].median() * 1e3:.1f} | 1 | baseline |
{rows}
"""
    command = "python -m bench b12" + (" --quick" if quick else "")
    return "B12", "Layouts: a step at DP(2)-TP(2) and DP(2)-PP(2) against DP(4), interleaved", command, body
