"""B4 against an earlier commit: is this code's analysis slower or faster than that commit's, beyond the noise?

`python -m bench.analysis_against COMMIT [--rounds 20]` checks COMMIT out into a
temporary git worktree, writes one synthetic sweep of 1,000 runs x 1,000 steps
(B4's), and has it analysed by fresh processes (`python -m
bench.analysis_scale`, as B4 times it) of three arms in a random order each
round: COMMIT's code, this code, and this code again (the null control). Per
round, the ratio of two arms' times is a paired comparison; rounds are
independent, so the verdict is the exact signed-rank test on the log ratios,
with the Hodges-Lehmann ratio and the 95 % CI that inverts it
(`analysis.cost.randomization`). A difference the null control's CI cannot tell
from 1 is not reported as one. Prints the result; writes nothing to the repo.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from analysis.cost.randomization import signed_rank_shift
from analysis.testing.synthetic import write_sweep
from bench.analysis_scale import family

REPO = Path(__file__).resolve().parents[1]


def analysis_time(tree: Path, sweep: Path, out: Path) -> float:
    """Seconds of one fresh analysis of `sweep` by the code in `tree`."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.analysis_scale", str(sweep), str(out)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])["total_s"]


def ratio_line(name: str, times: dict[str, list[float]], arm: str, base: str) -> str:
    shift = signed_rank_shift(np.log(times[arm]) - np.log(times[base]))
    low, estimate, high = (math.exp(v) for v in (shift.low, shift.estimate, shift.high))
    return f"{name}: {arm} / {base} = {estimate:.3f} [{low:.3f}, {high:.3f}] (p = {shift.p_value:.2g})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit", help="the earlier commit to compare with (e.g. a tag or a hash)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--runs", type=int, default=1000, help="the synthetic sweep's runs (B4: 1,000)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        earlier = folder / "earlier"
        subprocess.run(["git", "worktree", "add", "--detach", str(earlier), args.commit], cwd=REPO, check=True)
        try:
            sweep = write_sweep(folder / "sweep", [r for seed in range(args.runs // 10) for r in family(seed, 1000)])
            os.sync()  # the sweep's pages reach the disk before the timed analyses
            trees = {"earlier": earlier, "this": REPO, "this again": REPO}
            times: dict[str, list[float]] = {arm: [] for arm in trees}
            order = random.Random(0)
            for round_ in range(args.rounds):
                arms = list(trees)
                order.shuffle(arms)
                for arm in arms:
                    times[arm].append(analysis_time(trees[arm], sweep, folder / f"out_{round_}_{arm}"))
                print(f"round {round_ + 1}: " + ", ".join(f"{a} {times[a][-1]:.2f} s" for a in trees), flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(earlier)], cwd=REPO, check=False)
    print("medians: " + ", ".join(f"{arm} {np.median(t):.2f} s" for arm, t in times.items()))
    print(ratio_line("null control", times, "this again", "this"))
    print(ratio_line("change", times, "this", "earlier"))


if __name__ == "__main__":
    main()
