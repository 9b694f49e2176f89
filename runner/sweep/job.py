"""One Hydra job: validate, write config.yaml, start (or join) the rank world, record the outcome.

Whatever happens inside a job, it ends with a summary.json in its directory
that records its `outcome` in this invocation (`outcome_at`), and returns
normally, so one failed job never stops a sweep or loses the others' results.
A single run exits 2 (EXIT_INVALID) when its config is refused or this
machine cannot run it, before any rank starts, and 1 when the job failed or
diverged (unless by an injected NaN), as a sweep does (`runner.sweep.tally`).
Ctrl-C or SIGTERM stops the ranks, records the job as interrupted and raises
`Interrupted` (`runner.sweep.interrupts`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from runner.config import rank_config, run_config_from, run_config_yaml
from runner.layout import ParallelLayout
from runner.record.config_file import write_config
from runner.record.summary import read_summary, update_summary
from runner.sweep import interrupts, rerun
from runner.sweep.machine import machine_problems, machine_shortfall, usable_cpu_cores, visible_cuda_devices
from runner.sweep.spawn import failure_report, run_world
from runner.sweep.tally import ends_badly
from runner.sweep.validate import EXIT_INVALID, InvalidConfig, config_problems, schema_problems
from runner.world.env import RankEnv, rank_env
from runner.world.worker import JobInfo, run_rank

log = logging.getLogger("runner")


def record_outcome(job_dir: Path, outcome: str, **fields) -> dict:
    """summary.json with this invocation's outcome of the job (what the sweep's tally counts)."""
    return update_summary(job_dir, outcome=outcome, outcome_at=round(time.time(), 3), **fields)


def run_job(hydra_task_cfg: DictConfig) -> dict:
    hydra_cfg = HydraConfig.get()
    job_dir = Path(hydra_cfg.runtime.output_dir)
    sweeping = hydra_cfg.mode == RunMode.MULTIRUN
    tag = f"#{hydra_cfg.job.num}" if sweeping else "run"
    name = hydra_cfg.job.override_dirname or "defaults"
    try:
        cfg = run_config_from(hydra_task_cfg)
    except OmegaConfBaseException as error:  # a key added with `+` that the schema does not know
        return _refuse(job_dir, tag, name, schema_problems(error), sweeping)
    layout = ParallelLayout.from_config(cfg)
    job = JobInfo(name=f"{layout} {name}", group=Path(hydra_cfg.sweep.dir).name if sweeping else job_dir.name)

    config_yaml = run_config_yaml(cfg)
    earlier = rerun.earlier_attempt(job_dir, config_yaml)
    if earlier == "completed":
        log.info(f"{tag} {job.name}: skipped, completed earlier in {job_dir}")
        record_outcome(job_dir, "skipped", skip_reason="completed earlier with the same config")
        return {"status": "skipped"}
    if earlier == "different":
        changes = rerun.differing_keys((job_dir / "config.yaml").read_text(), config_yaml)
        kept = rerun.supersede(job_dir)
        log.warning(
            f"{tag} {job.name}: {job_dir} held an earlier run of another config ({'; '.join(changes)}); "
            f"it is kept in {kept}, and this job runs anew"
        )
    if earlier == "stale":
        rerun.clear(job_dir)
    write_config(job_dir / "config.yaml", config_yaml)  # kept whatever happens next, invalid and skipped jobs too
    env = rank_env()  # None: this process starts the ranks, on this machine
    cuda_devices = visible_cuda_devices() if env is None else 0
    problems = config_problems(cfg)
    if env is None and not problems:
        problems = machine_problems(cfg, cuda_devices=cuda_devices, cpu_cores=usable_cpu_cores())
    if problems:
        return _refuse(job_dir, tag, job.name, problems, sweeping)

    if env is not None:
        return _join_world(cfg, job_dir, env, job, sweeping, tag)

    shortfall = machine_shortfall(cfg, cuda_devices)
    if shortfall:
        record_outcome(job_dir, "skipped", status="skipped", error=shortfall, run_name=job.name)
        if not sweeping:
            log.error(f"{tag} {job.name}: refused: {shortfall}")
            raise SystemExit(EXIT_INVALID)
        log.warning(f"{tag} {job.name}: skipped: {shortfall}")
        return {"status": "skipped"}

    rerun.clear(job_dir)
    log.info(f"{tag} {job.name}: {cfg.reduction.value}, {cfg.train.steps} steps -> {job_dir}")
    outcome = run_world(cfg.world_size, job_dir, ["--name", job.name, "--group", job.group], timeout_s=cfg.timeout_s)
    with interrupts.held():  # a second Ctrl-C must not cut the record short
        summary = _record_world(job_dir, cfg, outcome)
        _report(tag, job.name, summary, outcome.wall_s)
    if outcome.interrupted:
        sweep_dir = Path(hydra_cfg.sweep.dir) if sweeping else None
        raise interrupts.Interrupted(outcome.interrupted, job_dir=job_dir, sweep_dir=sweep_dir)
    if not sweeping and ends_badly(summary["status"], cfg.fault.kind):
        raise SystemExit(1)  # after the summary is written; a sweep's tally does the same for its jobs
    return {"status": summary["status"]}


def _refuse(job_dir: Path, tag: str, name: str, problems: list[tuple[str, str]], sweeping: bool) -> dict:
    error = InvalidConfig(problems)
    job_dir.mkdir(parents=True, exist_ok=True)
    fields = [f for f, _ in problems]
    record_outcome(job_dir, "invalid", status="invalid", error=str(error), problems=fields, run_name=name)
    log.error(f"{tag} {name}: {error}")
    if not sweeping:
        raise SystemExit(EXIT_INVALID)
    return {"status": "invalid"}


def _record_world(job_dir: Path, cfg, outcome) -> dict:
    """summary.json after the ranks ended: the root cause of a failure, a timeout, or the interruption."""
    if not outcome.ok:
        root_cause = {}
        if outcome.interrupted:
            error = f"interrupted ({interrupts.Interrupted(outcome.interrupted).name}) {_progress(job_dir)}"
        elif outcome.timed_out:
            error = f"timed out after timeout_s={cfg.timeout_s:g} s"
        else:
            # The root cause, not rank 0's own view (it fails too, later, when a peer dies).
            rank, error = failure_report(job_dir, outcome.returncodes)
            root_cause = {"failed_rank": rank}
        update_summary(job_dir, status="failed", error=error, interrupted=bool(outcome.interrupted), **root_cause)
    status = (read_summary(job_dir) or {}).get("status", "failed")  # no summary: rank 0 died before writing one
    return record_outcome(
        job_dir, status, status=status, returncodes=outcome.returncodes, job_wall_s=round(outcome.wall_s, 3)
    )


def _progress(job_dir: Path) -> str:
    """How far an interrupted job got, from its metrics file."""
    metrics = job_dir / "metrics.jsonl"
    steps = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    if not steps:
        return "before its first step was recorded; a rerun into this directory runs it again"
    return f"after {steps} recorded step(s), which are kept; a rerun into this directory runs it again"


def _report(tag: str, name: str, summary: dict, wall_s: float) -> None:
    status = summary.get("status", "failed")
    if status == "completed":
        log.info(f"{tag} {name}: completed in {wall_s:.1f} s, final loss {summary.get('final_loss', float('nan')):.4f}")
    else:
        first_line = (summary.get("error") or "").splitlines()[:1]
        log.error(f"{tag} {name}: {status} after {wall_s:.1f} s: {first_line[0] if first_line else ''}")


def _join_world(cfg: DictConfig, job_dir: Path, env: RankEnv, job: JobInfo, sweeping: bool, tag: str) -> dict:
    """This process is already one rank of a world (torchrun's or a SLURM step's): train in-process.

    Under torchrun the process then exits (`os._exit`, as a spawned rank does),
    after rank 0 has logged the job's outcome. A SLURM task returns its status,
    so that Hydra's submitit launcher records the job and goes on with the sweep.
    """
    if sweeping and env.launcher != "slurm":
        raise SystemExit(f"under {env.launcher}, run one job per launch (drop -m); sweeps start their own rank worlds")
    if env.world_size != cfg.world_size:
        raise SystemExit(
            f"world_size={cfg.world_size} but the {env.launcher} launcher started {env.world_size} ranks; "
            f"set world_size={env.world_size} or start {cfg.world_size} ranks"
        )
    if env.is_main:
        rerun.clear(job_dir)
    started = time.time()
    code = run_rank(rank_config(cfg), job_dir, env, job, started)
    if env.is_main:
        summary = record_outcome(job_dir, (read_summary(job_dir) or {}).get("status", "failed"))
        _report(tag, job.name, summary, time.time() - started)
    sys.stdout.flush()
    sys.stderr.flush()
    if env.launcher == "slurm":
        return {"status": (read_summary(job_dir) or {}).get("status", "failed") if env.is_main else "rank"}
    logging.shutdown()  # runner.log gets the lines above: os._exit skips the handlers' flush
    os._exit(code)
