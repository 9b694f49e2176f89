"""End to end: `python -m runner -m experiment=rl`, then `python -m analysis --check` holds every run to its mode's
statement (custom.expect_layouts against itself at W=1, custom.weighs against the papers), and fails when one
does not hold.

Trimmed to fit a few minutes on two cores: 6 of the 16 modes (the reference, verl token-mean, TRL bnpo, TRL dapo,
verl's token-mean with the sequence shard's count (#5983), the DAPO paper's objective) at 3 of the 4 layouts
(w1, w2, w2_sp2; grad_accum is covered rule by rule in tests/test_rl_rules.py), 2 steps each: 18 jobs.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme_post_training import readme_table

TRAINERS = "reference,verl_token_mean,trl_bnpo,trl_dapo,verl_cp_count_token_mean,paper_dapo"
LAYOUTS = "w1,w2,w2_sp2"


def run_module(module: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=1200)


def rows(path: Path) -> dict[str, dict]:
    with path.open() as f:
        return {row["mode"]: row for row in csv.DictReader(f)}


@pytest.mark.slow
def test_the_rl_sweep_passes_its_check_and_a_wrong_statement_fails_it(tmp_path):
    sweep = tmp_path / "rl"
    done = run_module(
        "runner",
        ["-m", "experiment=rl", f"trainer={TRAINERS}", f"layout={LAYOUTS}", f"hydra.sweep.dir={sweep}"],
        tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checked = run_module("analysis", [str(sweep), "--check", "--wandb", "disabled"], tmp_path)
    out = checked.stdout + checked.stderr
    assert checked.returncode == 0, out[-4000:]
    # 6 modes x 2 layouts besides W=1, and the 5 other modes against the DAPO paper's objective
    assert "check: all 17 post-training comparisons are as stated" in out, out[-4000:]

    rl = rows(sweep / "analysis" / "rl.csv")
    assert len(rl) == 6 and all(row["as_expected"] == "True" for row in rl.values())
    invariant = {mode for mode, row in rl.items() if row["invariant"] == "True"}
    assert invariant == {"sum", "verl token-mean", "TRL dapo", "DAPO (paper)"}
    assert rl["TRL bnpo"]["changes_with"] == "dp" and "another direction" in rl["TRL bnpo"]["changes"]
    assert rl["verl token-mean (CP count)"]["changes_with"] == "sp"
    assert rl["verl token-mean"]["vs DAPO (paper)"].startswith("the tokens of long groups more (cos ")
    for mode, row in rl.items():  # README's table, as measured here: these layouts vary dp and sp, not grad_accum
        readme = readme_table()[mode]
        axes = [axis for axis in readme["changes_with"].split(", ") if axis in ("dp", "sp")]
        assert row["weighs"] == readme["weighs"], mode
        assert row["changes_with"] == ", ".join(axes), mode
        assert (row["invariant"] == "True") == (not axes), mode
    report = (sweep / "analysis" / "report.md").read_text()
    assert "## Post-training aggregation" in report and (sweep / "analysis" / "post_training.png").exists()

    # The same runs held to a wrong statement: bnpo said to be invariant.
    bnpo = [job for job in sweep.iterdir() if "trl_bnpo" in job.name]
    for job in bnpo:
        config = job / "config.yaml"
        config.write_text(config.read_text().replace("changes with dp, grad_accum", "invariant"))
        (job / "config.json").unlink(missing_ok=True)  # the copy the analysis would read first
    wrong = run_module(
        "analysis", [str(sweep), "--check", "--wandb", "disabled", "--no-plots", "--out", "wrong"], tmp_path
    )
    assert wrong.returncode == 1, (wrong.stdout + wrong.stderr)[-4000:]
    assert "check FAILED: 1 post-training run(s)" in wrong.stdout and "TRL bnpo" in wrong.stdout
