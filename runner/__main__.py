"""`python -m runner [-m] [overrides]`: one job, or with -m a Hydra sweep of jobs (`--help` lists them).

Exit status: 0 when the job (every job of a sweep) completed or was skipped
or refused in a sweep that has valid jobs; 1 when a job failed or diverged
(unless by an injected NaN); 2 when the input was refused before any rank
started; 130 after Ctrl-C (SIGINT) and 143 after SIGTERM, once the running
job is recorded as interrupted.
"""

import time

from runner.sweep import interrupts

interrupts.hold_for_good()  # first: a Ctrl-C during the imports below is noted, and ends the run right after them
STARTED = time.time()  # this invocation's jobs are those that recorded an outcome since

import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from runner.sweep import forked  # noqa: E402
from runner.world.env import rank_env  # noqa: E402

# Hydra's flags that print and exit: no job runs.
_NO_JOB_FLAGS = frozenset("--help -h --hydra-help --info -i --cfg -c --shell-completion -sc --version".split())
if rank_env() is None and not _NO_JOB_FLAGS & set(sys.argv[1:]):
    # The rank server's imports (torch: about 2 s) run beside this launcher's own, its composition and its
    # checks, instead of after them. Input refused below costs nothing for it: the server ends with the launcher.
    forked.prestart()

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from runner.config import register_configs  # noqa: E402
from runner.sweep import rerun  # noqa: E402
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


def report_interruption(signum: int, stop: interrupts.Interrupted | None) -> None:
    """Record any job of this invocation that a signal stopped before it recorded itself, then one line for the
    user: what this invocation did before the signal, and how to go on."""
    log = logging.getLogger("runner")
    name = signal.Signals(signum).name
    sweep_dir, job_dir = _where(stop)
    if sweep_dir is not None and sweep_dir.is_dir():
        for job in rerun.jobs_started_since(sweep_dir, STARTED):
            rerun.record_interrupted(job, signum, since=STARTED)
        line = tally(sweep_dir, since=STARTED).line()
        log.error(f"sweep interrupted by {name}: {line} -> {sweep_dir}; a rerun into it runs what did not complete")
    elif job_dir is not None:
        rerun.record_interrupted(job_dir, signum, since=STARTED)
        log.error(f"run interrupted by {name} -> {job_dir} (its summary.json records how far it got)")
    else:
        print(f"runner: interrupted by {name} before a job started", file=sys.stderr)


def _where(stop: interrupts.Interrupted | None) -> tuple[Path | None, Path | None]:
    """(the sweep's folder, or None; the single run's folder, or None): from the job the signal stopped, else
    from where Hydra was putting this invocation's jobs (a signal between the jobs, or in Hydra's own start of
    one: `interrupts.JobFolders`)."""
    if stop is not None and stop.job_dir is not None:
        return stop.sweep_dir, None if stop.sweep_dir is not None else stop.job_dir
    folders = interrupts.folders()
    run = folders.get("run")
    return folders.get("sweep"), run if run is not None and run.is_dir() else None


def _main() -> int:
    """Hydra's run; the exit status of the input, the job or the sweep (`runner.sweep.tally`)."""
    try:
        main()
    except SystemExit as exit:
        # Hydra reports any error with status 1. Before the first job started, the
        # error is in the input (an unknown key, a wrong type, a value not in a
        # group or enum, an override's syntax): refused before launch, like the rest.
        if exit.code == 1 and _jobs_started == 0:
            return EXIT_INVALID
        return exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.argv[1:] = quote_home_paths(sys.argv[1:])
    problems = override_problems(sys.argv[1:])
    if problems:
        print(f"runner: {InvalidConfig(problems)}", file=sys.stderr)
        raise SystemExit(EXIT_INVALID)
    stop, code = None, 0
    try:
        try:
            interrupts.install()  # from here to the first job, and between jobs, a signal raises `Interrupted`
            if interrupts.first_signal() is None:  # one during the imports ends the run before anything started
                code = _main()
        finally:
            interrupts.hold_for_good()  # the work is done or stopped: a signal from here on is only noted
    except interrupts.Interrupted as interrupted:
        stop = interrupted
    signum = interrupts.block_for_exit()
    if signum is not None:  # the first signal decides, wherever it arrived (and however the work ended)
        report_interruption(signum, stop)
        # Exit now: the interpreter's shutdown would finalize what the signal cut short (a half-run context
        # manager of Hydra's composition prints "Exception ignored ... Python is likely shutting down").
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signum)
    raise SystemExit(code)
