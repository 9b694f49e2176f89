"""B4: how long the analysis takes on 1,000 runs x 1,000 steps (goal < 5 s), and on 100, to show its growth.

Writes synthetic sweeps (analysis.synthetic: every mode's behaviour built in,
a world_size=1 ground truth per family, collectives counted on the runner's
sampled steps) to a temporary folder, then times `analysis.pipeline.analyze`
on each, phase by phase, W&B off. Writing the sweeps is not timed.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from analysis.pipeline import analyze
from analysis.synthetic import SyntheticRun, write_sweep

GOAL_S = 5.0


def family(seed: int, steps: int) -> list[SyntheticRun]:
    """10 runs: the world_size=1 ground truth, six modes at W=2, three at W=4."""
    runs = [SyntheticRun("sum", world_size=1, seed=seed, steps=steps)]
    for world, modes in ((2, ["sum", "fsdp_sum", "scaled", "local", "detached", "mean_of_means"]), (4, ["sum", "local", "mean_of_means"])):
        for mode in modes:
            factor = 1 / world if mode in ("local", "detached") else 1.0
            runs.append(SyntheticRun(mode, world_size=world, seed=seed, steps=steps, factor=factor, turn=0.1 if mode == "mean_of_means" else 0.0))
    return runs


def timed(folder: Path, runs: int, steps: int) -> tuple[float, dict, bool]:
    sweep = write_sweep(folder / f"sweep{runs}", [r for seed in range(runs // 10) for r in family(seed, steps)])
    started = time.perf_counter()
    result = analyze([sweep], folder / f"analysis{runs}", wandb_mode="disabled")
    return time.perf_counter() - started, result.timings, bool(result.verdicts["as_expected"].all())


def run(quick: bool) -> tuple[str, str, str]:
    sizes, steps = ((20, 100), 50) if quick else ((100, 1000), 1000)
    with tempfile.TemporaryDirectory() as tmp:
        results = {runs: timed(Path(tmp), runs, steps) for runs in sizes}
    small, large = sizes
    phases = list(results[large][1])
    rows = "\n".join(
        f"| {phase} | {results[small][1][phase]:.2f} | {results[large][1][phase]:.2f} |" for phase in phases
    )
    total_small, total_large = results[small][0], results[large][0]
    body = f"""
Synthetic sweeps of {small} and {large} runs x {steps} steps, plots included, W&B off.

| phase | {small} runs (s) | {large} runs (s) |
|---|---|---|
{rows}
| **total** | **{total_small:.2f}** | **{total_large:.2f}** |

{large} runs: **{total_large:.2f} s** (goal: under {GOAL_S:.0f} s: {'met' if total_large < GOAL_S else 'NOT met'}).
{large // small}x the runs took {total_large / total_small:.1f}x the time (linear growth would be {large // small}x; the fixed part,
plots of at most 16 groups among it, keeps it below). Every verdict as expected: {all(r[2] for r in results.values())}.
"""
    command = "python -m bench b4" + (" --quick" if quick else "")
    return "B4", f"Analysis of {large} runs x {steps} steps", command, body
