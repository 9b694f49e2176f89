"""What the analysis does with its input beyond the runs: runs of one config on different data are refused (naming
the runs and the part), a folder given twice is analysed once and said so, and a cost job that was refused,
failed or left no record is reported as such while the rest is analysed (exit 0: `make run` does not fail)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.__main__ import main as analysis_main
from analysis.testing.synthetic import SyntheticRun, write_cost_job, write_sweep

QUIET = ["--no-plots", "--wandb", "disabled"]


def identity(data: str, tokenizer: str | None = None) -> dict:
    """summary.json's `identity` (runner.sweep.identity) with the given data and tokenizer hashes."""
    digest = f"{data}-{tokenizer}"
    return {"identity": {"digest": digest, "parts": {"data": data, "tokenizer": tokenizer, "config": "c"}}}


def runs_on(data: str, tokenizer: str | None = None, modes=("sum", "local")) -> list[SyntheticRun]:
    return [
        SyntheticRun(mode, steps=8, factor=0.5 if mode == "local" else 1.0, summary=identity(data, tokenizer))
        for mode in modes
    ]


# (first sweep's data and tokenizer, second's): every way two sweeps of one config can differ in what they read.
CASES = [
    (("d1", None), ("d2", None), "data"),
    (("d1", None), ("d1", "t1"), "tokenizer"),
    (("d1", "t1"), ("d1", "t2"), "tokenizer"),
    (("d1", "t1"), ("d2", "t2"), "data"),  # both differ: the first named is data (the tokenizer's follows)
]


@pytest.mark.parametrize("first, second, part", CASES)
def test_sweeps_of_one_config_on_different_data_are_refused_naming_runs_and_part(tmp_path, capsys, first, second, part):
    s1 = write_sweep(tmp_path / "s1", runs_on(*first))
    s2 = write_sweep(tmp_path / "s2", runs_on(*second, modes=("sum",)))
    assert analysis_main([str(s1), str(s2), *QUIET]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"analysis: refused to compare: runs of one config trained on different {part} files: ")
    named = error.split(f"different {part} files: ", 1)[1].split(";")[0]
    assert "s1/0_sum_ws2_sp1_ga1_seed0" in named and "s1/1_local_ws2_sp1_ga1_seed0" in named
    assert "s2/0_sum_ws2_sp1_ga1_seed0" in named.split(" vs ")[1]
    assert not (s1 / "analysis-combined" / "report.md").exists()


def test_runs_on_the_same_data_or_without_an_identity_are_compared(tmp_path):
    same = [
        write_sweep(tmp_path / f"same{i}", runs_on("d1", "t1", modes=(mode,)))
        for i, mode in enumerate(["sum", "local"])
    ]
    assert analysis_main([*map(str, same), *QUIET]) == 0
    earlier = write_sweep(tmp_path / "earlier", [SyntheticRun("local", steps=8, factor=0.5)])  # no identity recorded
    assert analysis_main([str(same[0]), str(earlier), *QUIET]) == 0
    # Different data in another config (another seed: another family) is never compared, so not refused.
    other = write_sweep(tmp_path / "other", [SyntheticRun("sum", seed=1, steps=8, summary=identity("d2"))])
    assert analysis_main([str(same[0]), str(other), *QUIET]) == 0


@pytest.mark.parametrize("given", [["s1", "s1/"], ["s1", "s1/0_sum_ws2_sp1_ga1_seed0"], ["s1", "s1", "s1/"]])
def test_a_folder_given_twice_is_analysed_once_and_said_so(tmp_path, capsys, monkeypatch, given):
    write_sweep(tmp_path / "s1", runs_on("d1"))
    monkeypatch.chdir(tmp_path)
    assert analysis_main([*given, *QUIET]) == 0
    printed = capsys.readouterr().out
    assert "was given twice" in printed and "analysed once" in printed
    out = tmp_path / "s1" / ("analysis-combined" if len(given) > 1 else "analysis")
    verdicts = pd.read_csv(out / "verdicts.csv")
    assert len(verdicts) == 2 and verdicts["run"].is_unique


def test_two_sweeps_of_one_name_in_different_folders_keep_both_runs(tmp_path):
    a = write_sweep(tmp_path / "a" / "sweep", runs_on("d1", modes=("sum",)))
    b = write_sweep(tmp_path / "b" / "sweep", runs_on("d1", modes=("local",)))
    assert analysis_main([str(a), str(b), *QUIET]) == 0
    verdicts = pd.read_csv(a / "analysis-combined" / "verdicts.csv")
    assert len(verdicts) == 2 and verdicts["run"].is_unique


def _refused_by_the_runner(job: Path) -> str:
    """A cost job as `make run ARGS="train.steps=5"` leaves it: refused before launch (the runner's own record)."""
    command = [sys.executable, "-m", "runner", "experiment=cost", "train.steps=5", f"hydra.run.dir={job}"]
    subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    error = json.loads((job / "summary.json").read_text())["error"]
    assert "cost.warmup_steps=5 must be < train.steps=5" in error
    return " ".join(error.split())  # on one line


def _failed(job: Path) -> str:
    write_cost_job(job, {"sum": 1.1}, steps=20)
    (job / "metrics.jsonl").unlink()
    (job / "summary.json").write_text(json.dumps({"status": "failed", "error": "rank 1 exited with code 1"}))
    return "failed before it measured a step: rank 1 exited with code 1"


def _no_record(job: Path) -> str:
    (job / ".hydra").mkdir(parents=True)
    return "left no record (no config.yaml)"


def _refused_beside_an_earlier_measurement(job: Path) -> str:
    write_cost_job(job, {"sum": 1.1}, steps=20)
    (job / "refused.json").write_text(json.dumps({"outcome": "invalid", "error": "cost.floor_calls=0 must be >= 1"}))
    return "was refused in its last invocation (cost.floor_calls=0 must be >= 1); its earlier measurement is analysed"


COST_JOBS = {
    "refused": _refused_by_the_runner,
    "failed": _failed,
    "no record": _no_record,
    "refused again": _refused_beside_an_earlier_measurement,
}


@pytest.mark.parametrize("case, with_runs", list(itertools.product(COST_JOBS, [True, False])))
def test_a_cost_job_that_did_not_measure_is_reported_as_such_and_the_analysis_succeeds(
    tmp_path, capsys, case, with_runs
):
    sweep = tmp_path / "sweep"
    if with_runs:
        write_sweep(sweep, runs_on("d1"))
    expected = COST_JOBS[case](sweep / "cost")
    if case == "no record" and not with_runs:  # nothing here to analyse at all: said, exit 2
        assert analysis_main([str(sweep), *QUIET]) == 2
        return
    assert analysis_main([str(sweep), *QUIET]) == 0
    printed = capsys.readouterr().out
    assert f"analysis: the cost job in {sweep / 'cost'} " in printed and expected in printed
    report = (sweep / "analysis" / "report.md").read_text()
    cost = report.split("## Cost, measured interleaved", 1)[1]
    assert expected in cost
    if case != "refused again":  # the earlier measurement is analysed: the section has its table
        assert "Not measured: the cost job in " in cost
