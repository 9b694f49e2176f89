"""Check every job of a sweep before the first one starts.

Hydra's basic sweeper already refuses a sweep in which some job's config
cannot be composed (unknown key, wrong type, bad enum value). This callback
adds the cross-field rules of `runner.validate`: it lists the jobs that break
them (each is then recorded as `invalid` without starting a process) and stops
the sweep when no job is valid.
"""

from __future__ import annotations

import logging

from hydra import compose
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from omegaconf import DictConfig

from runner.config import run_config_from
from runner.validate import config_problems

log = logging.getLogger("runner")


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """The override list of every job, as the basic sweeper expands them (its params, then the command line)."""
    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
    overrides = OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))
    return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


class SweepPreflight(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        jobs = sweep_jobs(config)
        invalid = []
        for number, overrides in enumerate(jobs):
            problems = config_problems(run_config_from(compose(config.hydra.job.config_name, overrides)))
            if problems:
                messages = "; ".join(message for _, message in problems)
                invalid.append(f"  #{number} {' '.join(overrides)}: {messages}")
        if not invalid:
            log.info(f"preflight: all {len(jobs)} jobs are valid")
            return
        report = "\n".join(invalid)
        if len(invalid) == len(jobs):
            log.error(f"preflight: no job of this sweep is valid, nothing was started:\n{report}")
            # Hydra turns a callback's exceptions into warnings; SystemExit is not an Exception.
            raise SystemExit(2)
        log.warning(f"preflight: {len(invalid)} of {len(jobs)} jobs are invalid and will not start:\n{report}")
