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
from runner.validate import InvalidConfig, config_problems

log = logging.getLogger("runner")


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """The override list of every job, as the basic sweeper expands them (its params, then the command line)."""
    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
    overrides = OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))
    return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


class SweepPreflight(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        jobs = sweep_jobs(config)
        invalid: list[tuple[list[str], list[tuple[str, str]]]] = []
        for overrides in jobs:
            problems = config_problems(run_config_from(compose(config.hydra.job.config_name, overrides)))
            if problems:
                invalid.append((overrides, problems))
        if not invalid:
            log.info(f"preflight: all {len(jobs)} jobs are valid")
            return
        report = "\n".join(f"  {','.join(overrides)}: {InvalidConfig(problems)}" for overrides, problems in invalid)
        if len(invalid) == len(jobs):
            raise InvalidConfig([p for _, problems in invalid for p in problems])
        log.warning(f"preflight: {len(invalid)} of {len(jobs)} jobs are invalid and will not start:\n{report}")
