"""`python -m bench analysis`: how long the analysis takes on 1,000 runs x 1,000 steps.

Writes a synthetic sweep (analysis.synthetic: every mode's behaviour built in,
a world_size=1 ground truth per family) to a temporary folder, then times
`analysis.pipeline.analyze` on it, phase by phase, W&B off. Writing the
sweep is not timed. Writes bench/analysis_results.md with the command.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from analysis.pipeline import analyze
from analysis.synthetic import SyntheticRun, write_sweep

GOAL_S = 10.0


def family(seed: int, steps: int) -> list[SyntheticRun]:
    """10 runs: the world_size=1 ground truth, six modes at W=2, three at W=4."""
    runs = [SyntheticRun("sum", world_size=1, seed=seed, steps=steps)]
    for world, modes in ((2, ["sum", "fsdp_sum", "scaled", "local", "detached", "mean_of_means"]), (4, ["sum", "local", "mean_of_means"])):
        for mode in modes:
            factor = 1 / world if mode in ("local", "detached") else 1.0
            runs.append(SyntheticRun(mode, world_size=world, seed=seed, steps=steps, factor=factor, turn=0.1 if mode == "mean_of_means" else 0.0))
    return runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=1000, help="a multiple of 10")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "analysis_results.md")


def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        sweep = write_sweep(Path(tmp) / "sweep", [r for seed in range(args.runs // 10) for r in family(seed, args.steps)])
        written = time.perf_counter() - started
        started = time.perf_counter()
        result = analyze([sweep], Path(tmp) / "analysis", wandb_mode="disabled")
        total = time.perf_counter() - started
        check = result.verdicts["as_expected"].all()
    phases = "\n".join(f"| {name} | {seconds:.2f} |" for name, seconds in result.timings.items())
    text = "\n".join(
        [
            "# Benchmark: analysis of a large sweep",
            "",
            f"Command: `python -m bench analysis --runs {args.runs} --steps {args.steps}` (or `make bench`), "
            f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.",
            f"{args.runs} synthetic runs x {args.steps} steps ({args.runs * args.steps:,} metric records, "
            f"written in {written:.1f} s, not timed); plots included, W&B off.",
            "",
            f"**Total: {total:.2f} s** (goal: under {GOAL_S:.0f} s: {'met' if total < GOAL_S else 'NOT met'}); "
            f"every verdict as expected: {check}.",
            "",
            "| phase | seconds |",
            "|---|---|",
            phases,
            "",
        ]
    )
    args.out.write_text(text)
    print(text)
