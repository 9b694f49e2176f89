"""One Hydra job: validate, write config.yaml, start (or join) the rank world, record the outcome.

Whatever happens inside a job, it ends with a summary.json in its directory
and returns normally, so one failed job never stops a sweep or loses the
others' results. A single run (not a sweep) exits 2 (EXIT_INVALID) when its
config is refused, before any rank starts, and 1 when the job failed or
diverged (unless by an injected NaN), as a sweep does (`runner.sweep.tally`).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from runner.config import rank_config, run_config_from, run_config_yaml, save_run_config
from runner.layout import ParallelLayout
from runner.record.summary import read_summary, update_summary
from runner.sweep.spawn import failure_report, run_world
from runner.sweep.tally import ends_badly
from runner.sweep.validate import (
    EXIT_INVALID,
    InvalidConfig,
    config_problems,
    machine_problems,
    machine_shortfall,
    usable_cpu_cores,
    visible_cuda_devices,
)
from runner.world.env import RankEnv, rank_env
from runner.world.worker import JobInfo, run_rank

log = logging.getLogger("runner")


def _already_completed(job_dir: Path, cfg: DictConfig) -> bool:
    """A rerun into the same sweep directory resumes: completed jobs with the same config are kept."""
    summary = read_summary(job_dir)
    config_file = job_dir / "config.yaml"
    return (
        summary is not None
        and summary.get("status") == "completed"
        and config_file.exists()
        and config_file.read_text() == run_config_yaml(cfg)
    )


def _clear_earlier_attempt(job_dir: Path) -> None:
    """A rerun of a job that did not complete starts clean."""
    (job_dir / "summary.json").unlink(missing_ok=True)
    (job_dir / "metrics.jsonl").unlink(missing_ok=True)
    shutil.rmtree(job_dir / "wandb", ignore_errors=True)
    shutil.rmtree(job_dir / "logs", ignore_errors=True)


def run_job(hydra_task_cfg: DictConfig) -> dict:
    hydra_cfg = HydraConfig.get()
    job_dir = Path(hydra_cfg.runtime.output_dir)
    sweeping = hydra_cfg.mode == RunMode.MULTIRUN
    tag = f"#{hydra_cfg.job.num}" if sweeping else "run"
    cfg = run_config_from(hydra_task_cfg)
    layout = ParallelLayout.from_config(cfg)
    job = JobInfo(
        name=f"{layout} {hydra_cfg.job.override_dirname or 'defaults'}",
        group=Path(hydra_cfg.sweep.dir).name if sweeping else job_dir.name,
    )

    if _already_completed(job_dir, cfg):
        log.info(f"{tag} {job.name}: skipped, completed earlier in {job_dir}")
        return {"status": "completed"}

    save_run_config(cfg, job_dir / "config.yaml")  # kept whatever happens next, invalid and skipped jobs too
    env = rank_env()  # None: this process starts the ranks, on this machine
    cuda_devices = visible_cuda_devices() if env is None else 0
    problems = config_problems(cfg)
    if env is None:
        problems += machine_problems(cfg, cuda_devices=cuda_devices, cpu_cores=usable_cpu_cores())
    if problems:
        error = InvalidConfig(problems)
        update_summary(
            job_dir, status="invalid", error=str(error), problems=[f for f, _ in problems], run_name=job.name
        )
        log.error(f"{tag} {job.name}: {error}")
        if not sweeping:
            raise SystemExit(EXIT_INVALID)
        return {"status": "invalid"}

    if env is not None:
        return _join_world(cfg, job_dir, env, job, sweeping)

    shortfall = machine_shortfall(cfg, cuda_devices)
    if shortfall:
        update_summary(job_dir, status="skipped", error=shortfall, run_name=job.name)
        log.warning(f"{tag} {job.name}: skipped: {shortfall}")
        return {"status": "skipped"}

    _clear_earlier_attempt(job_dir)
    log.info(f"{tag} {job.name}: {cfg.reduction.value}, {cfg.train.steps} steps -> {job_dir}")
    outcome = run_world(cfg.world_size, job_dir, ["--name", job.name, "--group", job.group], timeout_s=cfg.timeout_s)
    if not outcome.ok:
        root_cause = {}
        if outcome.interrupted:
            error = "interrupted (SIGINT or SIGTERM); its metrics so far are kept, and a rerun into this sweep directory runs it again"
        elif outcome.timed_out:
            error = f"timed out after timeout_s={cfg.timeout_s:g} s"
        else:
            # The root cause, not rank 0's own view (it fails too, later, when a peer dies).
            rank, error = failure_report(job_dir, outcome.returncodes)
            root_cause = {"failed_rank": rank}
        update_summary(job_dir, status="failed", error=error, interrupted=outcome.interrupted, **root_cause)
    summary = update_summary(job_dir, returncodes=outcome.returncodes, job_wall_s=round(outcome.wall_s, 3))
    _report(tag, job.name, summary, outcome.wall_s)
    if outcome.interrupted:
        raise KeyboardInterrupt
    if not sweeping and ends_badly(summary["status"], cfg.fault.kind):
        raise SystemExit(1)  # after the summary is written; a sweep's tally does the same for its jobs
    return {"status": summary["status"]}


def _report(tag: str, name: str, summary: dict, wall_s: float) -> None:
    status = summary.get("status", "failed")
    if status == "completed":
        log.info(f"{tag} {name}: completed in {wall_s:.1f} s, final loss {summary.get('final_loss', float('nan')):.4f}")
    else:
        first_line = (summary.get("error") or "").splitlines()[:1]
        log.error(f"{tag} {name}: {status} after {wall_s:.1f} s: {first_line[0] if first_line else ''}")


def _join_world(cfg: DictConfig, job_dir: Path, env: RankEnv, job: JobInfo, sweeping: bool) -> dict:
    """This process is already one rank of a world (torchrun's or a SLURM step's): train in-process.

    Under torchrun the process then exits (`os._exit`, as a spawned rank does).
    A SLURM task returns its status, so that Hydra's submitit launcher records
    the job and goes on with the sweep.
    """
    if sweeping and env.launcher != "slurm":
        raise SystemExit(f"under {env.launcher}, run one job per launch (drop -m); sweeps start their own rank worlds")
    if env.world_size != cfg.world_size:
        raise SystemExit(
            f"world_size={cfg.world_size} but the {env.launcher} launcher started {env.world_size} ranks; "
            f"set world_size={env.world_size} or start {cfg.world_size} ranks"
        )
    if env.is_main:
        _clear_earlier_attempt(job_dir)
    code = run_rank(rank_config(cfg), job_dir, env, job, time.time())
    sys.stdout.flush()
    sys.stderr.flush()
    if env.launcher == "slurm":
        return {"status": (read_summary(job_dir) or {}).get("status", "failed") if env.is_main else "rank"}
    os._exit(code)
