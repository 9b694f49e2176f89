"""`python -m runner [-m] [overrides]`: one job, or with -m a Hydra sweep of jobs (`--help` lists them).

Exit status: 0 when the job (every job of a sweep) completed or was skipped
or refused in a sweep that has valid jobs; 1 when a job failed or diverged
(unless by an injected NaN); 2 when the input was refused before any rank
started; 130 after Ctrl-C (SIGINT) and 143 after SIGTERM, once the running
job is recorded as interrupted.
"""

import time

from runner.sweep import interrupts

interrupts.install()  # first: Ctrl-C during the imports below is handled too
STARTED = time.time()  # this invocation's jobs are those that recorded an outcome since

import logging  # noqa: E402
import sys  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from runner.config import register_configs  # noqa: E402
from runner.sweep.overrides import override_problems, quote_home_paths  # noqa: E402
from runner.sweep.tally import tally  # noqa: E402
from runner.sweep.validate import EXIT_INVALID, InvalidConfig  # noqa: E402

register_configs()
_jobs_started = 0


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    global _jobs_started
    _jobs_started += 1
    from runner.sweep.job import run_job

    return run_job(cfg)


def report_interruption(stop: interrupts.Interrupted) -> None:
    """One line for the user: what this invocation did before the signal, and how to go on."""
    log = logging.getLogger("runner")
    if stop.sweep_dir is not None and stop.sweep_dir.is_dir():
        line = tally(stop.sweep_dir, since=STARTED).line()
        log.error(
            f"sweep interrupted by {stop.name}: {line} -> {stop.sweep_dir}; a rerun into it runs what did not complete"
        )
    elif stop.job_dir is not None:
        log.error(f"run interrupted by {stop.name} -> {stop.job_dir} (its summary.json records how far it got)")
    else:
        print(f"runner: interrupted by {stop.name} before a job's ranks started", file=sys.stderr)


if __name__ == "__main__":
    sys.argv[1:] = quote_home_paths(sys.argv[1:])
    problems = override_problems(sys.argv[1:])
    if problems:
        print(f"runner: {InvalidConfig(problems)}", file=sys.stderr)
        raise SystemExit(EXIT_INVALID)
    try:
        main()
    except interrupts.Interrupted as stop:
        with interrupts.held():
            report_interruption(stop)
        raise SystemExit(stop.exit_code) from None
    except SystemExit as exit:
        # Hydra reports any error with status 1. Before the first job started, the
        # error is in the input (an unknown key, a wrong type, a value not in a
        # group or enum, an override's syntax): refused before launch, like the rest.
        if exit.code == 1 and _jobs_started == 0:
            raise SystemExit(EXIT_INVALID) from None
        raise
