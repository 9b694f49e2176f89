"""`python -m runner [-m] [overrides]`: one job, or with -m a Hydra sweep of jobs.

Exit status: 0 when the job (every job of a sweep) completed or was skipped
or refused in a sweep that has valid jobs; 1 when a job failed or diverged
(unless by an injected NaN); 2 when the input was refused before any rank started.
"""

import hydra
from omegaconf import DictConfig

from runner.config import register_configs
from runner.sweep.validate import EXIT_INVALID

register_configs()
_jobs_started = 0


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    global _jobs_started
    _jobs_started += 1
    from runner.sweep.job import run_job

    return run_job(cfg)


if __name__ == "__main__":
    try:
        main()
    except SystemExit as exit:
        # Hydra reports any error with status 1. Before the first job started, the
        # error is in the input (an unknown key, a wrong type, a value not in a
        # group or enum, an override's syntax): refused before launch, like the rest.
        if exit.code == 1 and _jobs_started == 0:
            raise SystemExit(EXIT_INVALID) from None
        raise
