"""B4: how long the analysis takes on 1,000 runs x 1,000 steps (goal < 5 s), and on 100, to show its growth.

Writes synthetic sweeps (analysis.testing.synthetic: every mode's behaviour built in,
a world_size=1 ground truth per family, collectives counted on the runner's
sampled steps) to a temporary folder, then times `analysis.pipeline.analyze`
on each, phase by phase, W&B off, in a fresh Python process as `python -m
analysis` runs it: not in the process that has just written a gigabyte of
sweep (its heap would make the analysis' fork and first touches dearer than a
user's). Writing the sweeps and the fresh process' imports are not timed; the
imports are stated beside.

`python -m bench.analysis_scale SWEEP OUT` is that fresh process: it prints the
timings as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STARTED = time.perf_counter()  # the analysis' imports, timed for the fresh process
from analysis.pipeline import analyze  # noqa: E402
from analysis.testing.synthetic import SyntheticRun, write_sweep  # noqa: E402

IMPORTED = time.perf_counter()

GOAL_S = 5.0


def family(seed: int, steps: int) -> list[SyntheticRun]:
    """10 runs: the world_size=1 ground truth, six modes at W=2, three at W=4."""
    runs = [SyntheticRun("sum", world_size=1, seed=seed, steps=steps)]
    for world, modes in (
        (2, ["sum", "fsdp_sum", "scaled", "local", "detached", "mean_of_means"]),
        (4, ["sum", "local", "mean_of_means"]),
    ):
        for mode in modes:
            factor = 1 / world if mode in ("local", "detached") else 1.0
            runs.append(
                SyntheticRun(
                    mode,
                    world_size=world,
                    seed=seed,
                    steps=steps,
                    factor=factor,
                    turn=0.1 if mode == "mean_of_means" else 0.0,
                )
            )
    return runs


REPEATS = 3  # fresh analyses of each sweep; the median one is reported


def timed(folder: Path, runs: int, steps: int) -> tuple[list[dict], dict]:
    """(every repeat's result, the median repeat's): total_s, timings, as_expected, imports_s."""
    sweep = write_sweep(folder / f"sweep{runs}", [r for seed in range(runs // 10) for r in family(seed, steps)])
    os.sync()  # the sweep's dirty pages reach the disk now, not during the timed analyses (a user's jobs wrote theirs long before)
    results = []
    for repeat in range(REPEATS):
        child = subprocess.run(
            [sys.executable, "-m", "bench.analysis_scale", str(sweep), str(folder / f"analysis{runs}_{repeat}")],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        results.append(json.loads(child.stdout.splitlines()[-1]))
    return results, sorted(results, key=lambda r: r["total_s"])[len(results) // 2]


def main(sweep: str, out: str) -> None:
    started = time.perf_counter()
    result = analyze([Path(sweep)], Path(out), wandb_mode="disabled")
    total = time.perf_counter() - started
    verdicts_ok = bool(result.verdicts["as_expected"].all())
    print(
        json.dumps(
            {"total_s": total, "timings": result.timings, "as_expected": verdicts_ok, "imports_s": IMPORTED - STARTED}
        )
    )


def run(quick: bool) -> tuple[str, str, str]:
    sizes, steps = ((20, 100), 50) if quick else ((100, 1000), 1000)
    with tempfile.TemporaryDirectory() as tmp:
        results = {runs: timed(Path(tmp), runs, steps) for runs in sizes}
    small, large = sizes
    median = {runs: results[runs][1] for runs in sizes}
    phases = list(median[large]["timings"])
    rows = "\n".join(
        f"| {phase} | {median[small]['timings'][phase]:.2f} | {median[large]['timings'][phase]:.2f} |"
        for phase in phases
    )
    total_small, total_large = median[small]["total_s"], median[large]["total_s"]
    every = {runs: ", ".join(f"{r['total_s']:.2f}" for r in results[runs][0]) for runs in sizes}
    as_expected = all(r["as_expected"] for runs in sizes for r in results[runs][0])
    body = f"""
Synthetic sweeps of {small} and {large} runs x {steps} steps, plots included, W&B off. Each sweep is analysed
{REPEATS} times, each time by a fresh Python process as `python -m analysis` would; the table is the median analysis.

| phase | {small} runs (s) | {large} runs (s) |
|---|---|---|
{rows}
| **total** | **{total_small:.2f}** | **{total_large:.2f}** |

The {REPEATS} analyses: {small} runs {every[small]} s; {large} runs {every[large]} s. Not in the totals: the fresh
process' imports (pandas, pyarrow, matplotlib), {median[large]["imports_s"]:.2f} s.

{large} runs: **{total_large:.2f} s**, the median of {REPEATS} (goal: under {GOAL_S:.0f} s: {"met" if total_large < GOAL_S else "NOT met"}).
{large // small}x the runs took {total_large / total_small:.1f}x the time (linear growth would be {large // small}x; the fixed part,
plots of at most 16 groups among it, keeps it below). Every verdict as expected: {as_expected}.
"""
    command = "python -m bench b4" + (" --quick" if quick else "")
    return "B4", f"Analysis of {large} runs x {steps} steps", command, body


if __name__ == "__main__":
    main(*sys.argv[1:])
