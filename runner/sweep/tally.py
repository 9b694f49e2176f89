"""The sweep's last line: how the jobs of this invocation ended, and the exit status that follows.

`completed 5, failed 1, diverged 0, invalid 1, skipped 0 -> multirun/<date_time>`,
counting only the jobs this invocation ran or skipped (a rerun into the same
directory does not count the earlier runs again; a job that completed earlier
counts as skipped). The sweep then exits 1 when a job failed, or diverged
without an injected NaN (`fault.kind=nan`), so a script or a CI job sees it;
2 when no job could run (each invalid, or skipped because this machine lacks
what it asks for). A single run follows the same rules (`runner.sweep.job`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runner.record.config_file import read_config
from runner.record.summary import STATUSES, read_summary
from runner.sweep import interrupts
from runner.sweep.rerun import REFUSED
from runner.sweep.validate import EXIT_INVALID

log = logging.getLogger("runner")


def ends_badly(status: str, fault_kind: str | None) -> bool:
    """Whether a job's outcome makes its run or sweep exit 1: it failed, or diverged without an injected NaN."""
    return status == "failed" or (status == "diverged" and fault_kind != "nan")


@dataclass
class Tally:
    counts: Counter  # outcome -> jobs of this invocation
    bad: list[str]  # the jobs that make the sweep fail: "<job> (<status>)"
    unrunnable: bool  # no job ran: each was invalid, or skipped because this machine cannot run it

    def line(self) -> str:
        return ", ".join(f"{status} {self.counts[status]}" for status in STATUSES)


def tally(sweep_dir: Path, since: float | None = None) -> Tally:
    """How the jobs of `sweep_dir` ended in the invocation that started at `since` (every job when None).

    Each job records its outcome and when (`outcome_at`) in summary.json; a job
    skipped because it completed earlier counts as skipped, not completed.
    """
    counts: Counter = Counter({status: 0 for status in STATUSES})
    bad, ran, unrunnable = [], 0, 0
    for job in sorted(p for p in sweep_dir.iterdir() if not p.name.startswith(".") and _is_job(p)):
        summary = read_summary(job) or {}
        refused = read_summary(job, REFUSED) or {}
        if since is not None and refused.get("outcome_at", 0) >= since:
            summary = refused  # refused in this invocation, beside an earlier run's files (`runner.sweep.rerun`)
        elif since is not None and summary.get("outcome_at", 0) < since:
            if summary or (job / "config.yaml").stat().st_mtime < since:
                continue  # an earlier invocation's job; a job of this one with no summary never finished
        outcome = summary.get("outcome", summary.get("status", "failed"))
        counts[outcome] += 1
        config = read_config(job / "config.yaml") if (job / "config.yaml").exists() else None
        fault_kind = (config or {}).get("fault", {}).get("kind")
        if ends_badly(outcome, fault_kind):
            bad.append(f"{job.name} ({outcome})")
        machine_skip = outcome == "skipped" and summary.get("status") == "skipped"
        unrunnable += outcome == "invalid" or machine_skip
        ran += 1
    return Tally(counts, bad, unrunnable=ran > 0 and unrunnable == ran)


def _is_job(folder: Path) -> bool:
    """A job's folder: it holds the job's config or a record of it (one interrupted before its config was
    written has summary.json alone)."""
    return any((folder / name).exists() for name in ("config.yaml", "summary.json", REFUSED))


class SweepTally(Callback):
    """The sweep's last line, over the jobs of this invocation; exit 1 when one failed, 2 when none could run."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.started = time.time()

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        result = tally(sweep_dir, since=getattr(self, "started", None))
        if result.bad:
            log.error(f"sweep: {result.line()} -> {sweep_dir}; not completed: {', '.join(result.bad)}")
            raise SystemExit(1)  # Hydra turns a callback's exceptions into warnings; SystemExit passes
        if result.unrunnable:
            log.error(f"sweep: {result.line()} -> {sweep_dir}; no job could run here")
            raise SystemExit(EXIT_INVALID)
        log.info(f"sweep: {result.line()} -> {sweep_dir}")


class JobFolders(Callback):
    """Notes where this invocation's jobs go, as Hydra starts, so that a signal anywhere (in Hydra's own start of
    a job, between the jobs) still finds the jobs to record and the sweep to tally (`runner.__main__`)."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        interrupts.note_folder("run", Path(config.hydra.run.dir))

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        interrupts.note_folder("sweep", Path(config.hydra.sweep.dir))
