"""A sweep folder that two invocations of `python -m runner -m` wrote into is analysed as its newest one: the
jobs an earlier list left there are named and left out, a single run inside it (the cost job) is kept, and a
job's own folder given as an argument is analysed whatever its invocation."""

from __future__ import annotations

import os
from pathlib import Path

from analysis.load.sweeps import load_sweeps
from analysis.pipeline import analyze
from analysis.testing.synthetic import SyntheticRun, write_sweep


def _launched(job: Path, mode: str, at_ns: int) -> None:
    """Hydra's .hydra/ of a job launched in `mode` (MULTIRUN or RUN) at `at_ns`."""
    hydra = job / ".hydra"
    hydra.mkdir(exist_ok=True)
    (hydra / "hydra.yaml").write_text(f"hydra:\n  run:\n    dir: .\n  mode: {mode}\n  job:\n    name: runner\n")
    (hydra / "overrides.yaml").write_text("- reduction=x\n")
    os.utime(hydra / "overrides.yaml", ns=(at_ns, at_ns))


def two_invocations(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    """`-m reduction=sum,local` then `-m reduction=sum,detached` into one folder (sum skipped as completed the
    second time, so launched again), and a single run (RUN) from before the second list."""
    sweep = write_sweep(tmp_path / "sweep", [SyntheticRun(m) for m in ("sum", "local", "detached", "scaled")])
    jobs = {path.name.split("_")[1]: path for path in sweep.iterdir() if path.is_dir()}
    newest = (sweep / "multirun.yaml").stat().st_mtime_ns
    os.utime(sweep / "multirun.yaml", ns=(newest, newest))
    _launched(jobs["sum"], "MULTIRUN", newest + 10**9)
    _launched(jobs["detached"], "MULTIRUN", newest + 2 * 10**9)
    _launched(jobs["local"], "MULTIRUN", newest - 60 * 10**9)
    _launched(jobs["scaled"], "RUN", newest - 30 * 10**9)
    return sweep, jobs


def test_the_newest_invocation_is_analysed_and_the_earlier_jobs_named(tmp_path):
    sweep, jobs = two_invocations(tmp_path)
    loaded = load_sweeps([sweep])
    assert sorted(loaded.runs["reduction"]) == ["detached", "scaled", "sum"]
    [note] = [note for note in loaded.notes if "earlier" in note]
    assert note.startswith(f"1 job folder in {sweep} ({jobs['local'].name}) was launched by an earlier")

    result = analyze([sweep], tmp_path / "out", make_plots=False, wandb_mode="disabled")
    report = result.report.read_text()
    assert f"Left out of this analysis: {note}." in report
    assert set(result.verdicts["reduction"]) == {"sum", "detached", "scaled"}


def test_a_job_given_itself_is_analysed_whatever_its_invocation(tmp_path):
    sweep, jobs = two_invocations(tmp_path)
    loaded = load_sweeps([sweep, jobs["local"]])
    assert sorted(loaded.runs["reduction"]) == ["detached", "local", "scaled", "sum"]


def test_a_sweep_without_dates_loses_nothing(tmp_path):
    # no .hydra/ (a synthetic or copied sweep), or no multirun.yaml (a folder of single runs): nothing to date
    sweep = write_sweep(tmp_path / "sweep", [SyntheticRun(m) for m in ("sum", "local")])
    assert len(load_sweeps([sweep]).runs) == 2
    _, jobs = two_invocations(tmp_path / "again")
    (tmp_path / "again" / "sweep" / "multirun.yaml").unlink()
    assert len(load_sweeps([tmp_path / "again" / "sweep"]).runs) == 4
