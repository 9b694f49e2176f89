"""The sweep's last line: how every job of the sweep directory ended, and the exit status that follows.

`completed 5, failed 1, diverged 0, invalid 1, skipped 0 -> multirun/<date_time>`;
the sweep then exits 1 when a job failed, or diverged without an injected NaN
(`fault.kind=nan`), so a script or a CI job sees it. Invalid and skipped jobs
were reported before launch and do not change the exit status. A single run
follows the same rule (`runner.sweep.job`).
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runner.record.config_file import read_config
from runner.record.summary import STATUSES, read_summary

log = logging.getLogger("runner")


def ends_badly(status: str, fault_kind: str | None) -> bool:
    """Whether a job's outcome makes its run or sweep exit 1: it failed, or diverged without an injected NaN."""
    return status == "failed" or (status == "diverged" and fault_kind != "nan")


def tally(sweep_dir: Path) -> tuple[Counter, list[str]]:
    """(status counts, the jobs that make the sweep fail) over the job directories of `sweep_dir`."""
    counts: Counter = Counter({status: 0 for status in STATUSES})
    bad = []
    for job in sorted(p for p in sweep_dir.iterdir() if (p / "config.yaml").exists()):
        status = (read_summary(job) or {}).get("status", "failed")  # no summary: it never finished
        counts[status] += 1
        fault_kind = (read_config(job / "config.yaml") or {}).get("fault", {}).get("kind")
        if ends_badly(status, fault_kind):
            bad.append(f"{job.name} ({status})")
    return counts, bad


class SweepTally(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        counts, bad = tally(sweep_dir)
        line = ", ".join(f"{status} {counts[status]}" for status in STATUSES)
        if not bad:
            log.info(f"sweep: {line} -> {sweep_dir}")
            return
        log.error(f"sweep: {line} -> {sweep_dir}; not completed: {', '.join(bad)}")
        raise SystemExit(1)  # Hydra turns a callback's exceptions into warnings; SystemExit passes
