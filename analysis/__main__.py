"""`python -m analysis [SWEEP_DIR ...]`: verdicts, invariance, communication cost, plots and a report.

With no directory: the newest sweep or run under multirun/ or outputs/. A
directory may be a sweep (multirun/<date_time>), a single run
(outputs/<date_time>), one job of a sweep, or an interleaved cost job alone
(its cost table and report section only). Several are analysed as one
(e.g. a world_size=1 reference sweep beside an ablation sweep). `--check`
exits 1 unless every run's verdict is the one its mode should get, and every
post-training run (objective=pg) gives what its mode states against itself at
W=1 (custom.expect_layouts) and against the papers' objectives (custom.weighs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from analysis.bugs.table import NOT_REPRODUCED, results_in_words
from analysis.gradients.groups import NotComparable
from analysis.gradients.tolerances import Tolerances
from analysis.load.jobs import newest_result, not_a_result
from analysis.load.sweeps import NOT_RUN
from analysis.pipeline import analyze
from analysis.trainers.table import judged_elsewhere
from analysis.wandb_log import WANDB_MODES

PRINTED = ["group_label", "reduction", "status", "verdict_text", "expected", "as_expected", "reason"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = Tolerances()
    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__.splitlines()[0])
    parser.add_argument(
        "sweeps",
        nargs="*",
        type=Path,
        help="sweep, run or job directories (default: the newest under multirun/ or outputs/)",
    )
    parser.add_argument(
        "--out", type=Path, help="output folder (default: SWEEP/analysis; with several sweeps, FIRST/analysis-combined)"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 unless every verdict is the expected one for its mode"
    )
    parser.add_argument(
        "--wandb", choices=WANDB_MODES, default="auto", help="W&B run of the analysis (auto: as the sweep's runs)"
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--loss-rtol", type=float, default=defaults.loss_rtol, help="relative loss difference of matching curves"
    )
    parser.add_argument(
        "--cos-tol", type=float, default=defaults.cos_tol, help="1 - cosine up to which directions are the same"
    )
    parser.add_argument(
        "--scale-rtol", type=float, default=defaults.scale_rtol, help="|k - 1| up to which the scale is the same"
    )
    args = parser.parse_args(argv)
    for sweep in args.sweeps:
        problem = not_a_result(sweep)
        if problem:
            parser.error(problem)
    for name in ("loss_rtol", "cos_tol", "scale_rtol"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        sweeps = args.sweeps or [newest_result()]
    except FileNotFoundError as error:
        print(f"analysis: {error}", file=sys.stderr)
        return 2
    out = args.out or sweeps[0] / ("analysis" if len(sweeps) == 1 else "analysis-combined")
    tol = Tolerances(loss_rtol=args.loss_rtol, cos_tol=args.cos_tol, scale_rtol=args.scale_rtol)
    try:
        result = analyze(sweeps, out, tol, make_plots=not args.no_plots, wandb_mode=args.wandb)
    except (FileNotFoundError, NotComparable) as error:
        print(f"analysis: {error}", file=sys.stderr)
        return 2

    for note in result.notes:
        print(f"analysis: {note}")
    table = result.verdicts.sort_values(["group_label", "reduction"]) if len(result.verdicts) else result.verdicts
    if len(table):
        with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_colwidth", 70):
            print(table[PRINTED].to_string(index=False))
        print()
    print(result.answer)
    print(f"wrote {out}/: {', '.join(result.written)}")
    if result.wandb_dir is not None:
        print(f"W&B analysis run: {result.wandb_dir}  (wandb sync {result.wandb_dir})")
    if not args.check:
        return 0
    if table.empty:
        print("check: no training runs to judge (only cost measurements)")
        return 0
    offending = table[table["as_expected"].eq(False)]
    unjudged = table[table["as_expected"].isna()]
    not_run = unjudged[unjudged["status"].isin(NOT_RUN)]
    if len(not_run):
        print(f"check: {len(not_run)} job(s) never ran (invalid or skipped); not judged")
    elsewhere_runs = set(result.runs.loc[judged_elsewhere(result.runs), "run"]) if "run" in result.runs else set()
    custom = unjudged[~unjudged["status"].isin(NOT_RUN)]
    elsewhere = custom["run"].isin(elsewhere_runs)
    if elsewhere.any():
        print(f"check: {elsewhere.sum()} custom run(s) judged in their own sections below (post-training, known bugs)")
    if (~elsewhere).any():
        print(f"check: {(~elsewhere).sum()} custom run(s) without custom.expect; not judged")
    for sentence in [s for s in table["all_reduce"].unique() if s]:  # which all-reduce the sum runs used
        print(f"check: {sentence}")
    post_training_failed = _check_post_training(result)
    bugs_failed = _known_bugs_check(result.bugs)
    if offending.empty:
        print(f"check: all {table['as_expected'].notna().sum()} verdicts are as expected")
        return 1 if post_training_failed or bugs_failed else 0
    print(f"check FAILED: {len(offending)} verdict(s) differ from what their mode should give:")
    with pd.option_context("display.width", 250, "display.max_colwidth", 90):
        print(offending[["run", "reduction", "verdict_text", "expected", "reason"]].to_string(index=False))
    return 1


def _check_post_training(result) -> bool:
    """Print the post-training runs' check (against the mode at W=1, against the papers); True if one fails."""
    runs, papers = result.post_training_runs, result.post_training_papers
    if runs.empty:
        return False
    off_runs = runs[runs["as_expected"].eq(False)]
    off_papers = papers[papers["as_declared"].eq(False)] if len(papers) else papers
    judged = runs["as_expected"].notna().sum() + (papers["as_declared"].notna().sum() if len(papers) else 0)
    if off_runs.empty and off_papers.empty:
        print(
            f"check: all {judged} post-training comparisons are as stated "
            "(custom.expect_layouts against W=1, custom.weighs against the papers)"
        )
        return False
    with pd.option_context("display.width", 250, "display.max_colwidth", 90):
        if len(off_runs):
            print(
                f"check FAILED: {len(off_runs)} post-training run(s) differ from their mode at W=1 otherwise than stated:"
            )
            print(off_runs[["run", "name", "layout", "change", "expected", "reason"]].to_string(index=False))
        if len(off_papers):
            print(
                f"check FAILED: {len(off_papers)} mode(s) against a paper's objective otherwise than custom.weighs states:"
            )
            print(off_papers[["name", "paper_name", "weighs", "paper_weighs", "difference"]].to_string(index=False))
    return True


def _known_bugs_check(bugs: pd.DataFrame) -> bool:
    """Print the known bugs' results (`analysis.bugs.table`); True when one is not reproduced (its fix included):
    a bug shown as stated on weaker evidence (a paraphrase, a construction) passes, under its own name."""
    if bugs.empty:
        return False
    missed = bugs[bugs["result"] == NOT_REPRODUCED]
    if missed.empty:
        print(
            f"check: all {len(bugs)} known bugs show as stated, each fix equivalent to the reference: {results_in_words(bugs)}"
        )
        return False
    print(f"check FAILED: {len(missed)} of {len(bugs)} known bug(s) not reproduced:")
    for _, row in missed.iterrows():
        print(f"  {row['bug']} ({row['reference']}): {row['why']}")
    return True


if __name__ == "__main__":
    sys.exit(main())
