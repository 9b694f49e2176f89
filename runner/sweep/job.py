"""One Hydra job: admit its config, weigh an earlier attempt in its folder, start (or join) the rank world,
record the outcome.

In this order, so that nothing is built from a config before it passed every rule and nothing is moved or
written before the job is sure to run:

0. The job folder's lock (`runner.sweep.folder_lock`): one launcher per folder, or this one is refused.
1. `runner.sweep.admission.admit`: every rule (the schema's, the config's, this machine's); a refused job
   records `invalid` and returns (a single run exits 2, EXIT_INVALID). Its folder's earlier run, if any,
   is left as it was (`runner.sweep.rerun.record_refusal` notes the refusal beside it).
2. The job's name and layout, from the admitted config; a valid job this machine cannot run is skipped.
3. Its run identity (`runner.sweep.identity`) against the folder's earlier attempt (`runner.sweep.rerun`):
   skipped when it completed with the same identity, else the earlier files are cleared or moved aside.
4. config.yaml (with config.json, the analysis' fast path) and summary.json's identity, then the ranks.

Whatever happens inside a job, it ends with a summary.json (or refused.json) in its directory that records
its `outcome` in this invocation (`outcome_at`), and returns normally, so one failed job never stops a sweep
or loses the others' results; a single run exits 1 when the job failed or diverged (unless by an injected
NaN), as a sweep does (`runner.sweep.tally`). The job runs with SIGINT and SIGTERM held
(`runner.sweep.interrupts`): a signal stops it where it is safe to (before the ranks start, or by stopping
them), the job records itself, and `Interrupted` is raised at its end.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from runner.config import rank_config
from runner.record.config_file import write_config
from runner.record.summary import read_summary, update_summary
from runner.sweep import folder_lock, forked, interrupts, rerun
from runner.sweep.admission import Admitted, Refused, admit
from runner.sweep.custom_check import custom_fn_facts
from runner.sweep.identity import changed_sources, identity_changes, run_identity
from runner.sweep.machine import machine_shortfall, usable_cpu_cores, visible_cuda_devices
from runner.sweep.spawn import failure_report, run_world
from runner.sweep.tally import ends_badly
from runner.sweep.validate import EXIT_INVALID, InvalidConfig
from runner.world.env import RankEnv, rank_env
from runner.world.worker import JobInfo, run_rank

log = logging.getLogger("runner")
# How long a checkpointing job's ranks get, once stopped, to save the step they are in (`runner.train.stop_request`).
CHECKPOINT_STOP_WAIT_S = 120.0


@dataclass(frozen=True)
class JobPlace:
    """Where a job runs, from Hydra's own config (nothing here comes from the job's config)."""

    job_dir: Path
    sweep_dir: Path | None  # None for a single run
    tag: str  # "#3" in a sweep, "run" alone
    overrides: str  # the job's overrides, as Hydra joins them ("defaults" when none)
    started: float
    trainer: str | None = None  # Hydra's choice of the trainer group (trainer=NAME)
    choices: dict | None = None  # Hydra's runtime choices of every config group
    task_overrides: tuple[str, ...] = ()  # the job's overrides, as Hydra lists them

    @classmethod
    def of_hydra(cls) -> JobPlace:
        hydra_cfg = HydraConfig.get()
        sweeping = hydra_cfg.mode == RunMode.MULTIRUN
        return cls(
            job_dir=Path(hydra_cfg.runtime.output_dir),
            sweep_dir=Path(hydra_cfg.sweep.dir) if sweeping else None,
            tag=f"#{hydra_cfg.job.num}" if sweeping else "run",
            overrides=hydra_cfg.job.override_dirname or "defaults",
            started=time.time(),
            trainer=hydra_cfg.runtime.choices.get("trainer"),
            choices=dict(hydra_cfg.runtime.choices),
            task_overrides=tuple(hydra_cfg.overrides.task),
        )

    @property
    def sweeping(self) -> bool:
        return self.sweep_dir is not None

    @property
    def group(self) -> str:
        return self.sweep_dir.name if self.sweep_dir is not None else self.job_dir.name


def record_outcome(job_dir: Path, outcome: str, **fields) -> dict:
    """summary.json with this invocation's outcome of the job (what the sweep's tally counts)."""
    return update_summary(job_dir, outcome=outcome, outcome_at=round(time.time(), 3), **fields)


def run_job(hydra_task_cfg: DictConfig, place: JobPlace | None = None) -> dict:
    place = place or JobPlace.of_hydra()
    with interrupts.held(deliver=False) as arrived:
        if rank_env() is not None:  # a rank of a torchrun world: its launcher is torchrun's
            result = _run(hydra_task_cfg, place, arrived)
        else:
            try:
                with folder_lock.held(place.job_dir) as took_over:
                    if took_over:
                        log.warning(f"{place.tag}: {took_over}")
                    result = _run(hydra_task_cfg, place, arrived)
            except folder_lock.FolderInUse as in_use:
                result = _folder_in_use(place, in_use)
    if arrived:
        raise interrupts.Interrupted(arrived[0], job_dir=place.job_dir, sweep_dir=place.sweep_dir)
    return result


def _run(hydra_task_cfg: DictConfig, place: JobPlace, arrived: list[int]) -> dict:
    env = rank_env()  # None: this process starts the ranks, on this machine
    cuda_devices = visible_cuda_devices() if env is None else 0
    machine = {"cuda_devices": cuda_devices, "cpu_cores": usable_cpu_cores()} if env is None else None
    verdict = admit(
        hydra_task_cfg,
        machine=machine,
        sweeping=place.sweeping,
        trainer=place.trainer,
        choices=place.choices,
        task_overrides=list(place.task_overrides),
    )
    if isinstance(verdict, Refused):
        return _refuse(place, verdict)
    cfg = verdict.cfg
    job = JobInfo(name=f"{verdict.layout} {place.overrides}", group=place.group)  # only now: cfg is valid

    shortfall = machine_shortfall(cfg, cuda_devices) if env is None else None
    if shortfall:
        return _skip_here(place, job, verdict, shortfall)
    facts = custom_fn_facts(cfg.custom.fn) if cfg.reduction.value == "custom" else None
    identity = run_identity(cfg, verdict.config_yaml, facts)
    if arrived:  # stopped before anything of this attempt was written
        rerun.record_interrupted(place.job_dir, arrived[0], since=place.started, ours=True)
        return {"status": "failed"}
    earlier = rerun.earlier_attempt(place.job_dir, identity, verdict.config_yaml)
    if earlier == "completed":
        log.info(f"{place.tag} {job.name}: skipped, completed earlier in {place.job_dir}")
        record_outcome(place.job_dir, "skipped", skip_reason="completed earlier with the same identity")
        return {"status": "skipped"}
    if env is None:
        forked.prestart()  # the rank server's imports, while the job's folder is settled below
    main_rank = env is None or env.is_main
    if main_rank:
        if earlier == "different":
            _supersede(place, job, verdict.config_yaml, identity)
        resuming = earlier in ("unfinished", "continued")
        resumes = rerun.resumable(place.job_dir, cfg.train.checkpoint_every) if resuming else None
        if resumes is not None:
            why = rerun.resume_reason(place.job_dir, earlier, verdict.config_yaml)
            log.info(f"{place.tag} {job.name}: resumes from its newest complete checkpoint, step {resumes} ({why})")
        # an unfinished or stale attempt's files; config.yaml and config.json anew below
        rerun.clear(place.job_dir, keep=rerun.RESUMED_FILES if resumes is not None else ())
        write_config(place.job_dir / "config.yaml", verdict.config_yaml)
        ignored = {key: reason for key, reason in verdict.ignored}
        update_summary(place.job_dir, identity=identity, run_name=job.name, **({"ignored": ignored} if ignored else {}))
    if env is not None:
        return _join_world(cfg, place, env, job)

    log.info(f"{place.tag} {job.name}: {cfg.reduction.value}, {cfg.train.steps} steps -> {place.job_dir}")
    outcome = run_world(
        cfg.world_size,
        place.job_dir,
        ["--name", job.name, "--group", job.group],
        timeout_s=cfg.timeout_s,
        signals=arrived,
        term_wait_s=CHECKPOINT_STOP_WAIT_S if cfg.train.checkpoint_every and not cfg.cost.modes else 5.0,
    )
    summary = _record_world(place.job_dir, cfg, outcome)
    _report(place.tag, job.name, summary, outcome.wall_s)
    if not place.sweeping and not arrived and ends_badly(summary["status"], cfg.fault.kind):
        raise SystemExit(1)  # after the summary is written; a sweep's tally does the same for its jobs
    return {"status": summary["status"]}


def _supersede(place: JobPlace, job: JobInfo, config_yaml: str, identity: dict) -> None:
    """The folder's earlier run, of another identity, moves aside: one line says where and what differs."""
    old_config = place.job_dir / "config.yaml"
    changes = rerun.differing_keys(old_config.read_text(), config_yaml) if old_config.exists() else []
    changes += identity_changes((read_summary(place.job_dir) or {}).get("identity"), identity) if not changes else []
    kept = rerun.supersede(place.job_dir)
    log.warning(
        f"{place.tag} {job.name}: {place.job_dir} held an earlier run of another identity "
        f"({'; '.join(changes) or 'its record differs'}); it is kept in {kept}, and this job runs anew"
    )


def _refuse(place: JobPlace, refused: Refused) -> dict:
    """Refused before launch: recorded `invalid`, and an earlier run in the folder left as it was."""
    error = InvalidConfig(refused.problems)
    fields = {"status": "invalid", "error": str(error), "problems": [f for f, _ in refused.problems]}
    _record_not_run(place, refused.config_yaml, "invalid", fields)
    log.error(f"{place.tag} {place.overrides}: {error}")
    if not place.sweeping:
        raise SystemExit(EXIT_INVALID)
    return {"status": "invalid"}


def _folder_in_use(place: JobPlace, in_use: folder_lock.FolderInUse) -> dict:
    """Another launcher runs this job's folder: no run's file of it is read or written (a single run exits 2;
    a sweep's tally counts the job failed through refused.json, beside that launcher's files)."""
    log.error(f"{place.tag} {place.overrides}: refused: {in_use}")
    if not place.sweeping:
        raise SystemExit(EXIT_INVALID)
    rerun.record_refusal(place.job_dir, "failed", status="failed", error=str(in_use))
    return {"status": "failed"}


def _skip_here(place: JobPlace, job: JobInfo, admitted: Admitted, shortfall: str) -> dict:
    """Valid, but this machine lacks what it asks for: skipped (a single run exits 2)."""
    _record_not_run(place, admitted.config_yaml, "skipped", {"status": "skipped", "error": shortfall})
    if not place.sweeping:
        log.error(f"{place.tag} {job.name}: refused: {shortfall}")
        raise SystemExit(EXIT_INVALID)
    log.warning(f"{place.tag} {job.name}: skipped: {shortfall}")
    return {"status": "skipped"}


def _record_not_run(place: JobPlace, config_yaml: str | None, outcome: str, fields: dict) -> None:
    """The record of a job that will not run. A folder holding an earlier run keeps its files untouched; a
    sweep's tally still counts the job (refused.json beside them). Otherwise the folder holds this job's
    config.yaml (when it composed) and summary.json."""
    job_dir = place.job_dir
    job_dir.mkdir(parents=True, exist_ok=True)
    if rerun.holds_results(job_dir):
        if place.sweeping:
            rerun.record_refusal(job_dir, outcome, **fields)
        log.warning(f"{place.tag} {place.overrides}: the earlier run in {job_dir} is left as it was")
        return
    rerun.clear(job_dir)
    if config_yaml is not None:
        write_config(job_dir / "config.yaml", config_yaml)
    record_outcome(job_dir, outcome, run_name=place.overrides, **fields)


def _record_world(job_dir: Path, cfg, outcome) -> dict:
    """summary.json after the ranks ended: the root cause of a failure, a timeout, or the interruption."""
    if not outcome.ok:
        root_cause = {}
        if outcome.interrupted:
            name = interrupts.Interrupted(outcome.interrupted).name
            error = f"interrupted ({name}) {rerun.progress(job_dir)}"
            # What stopped the job is the launcher's signal (a Ctrl-C is SIGINT); it stopped the ranks with SIGTERM.
            ranks = (read_summary(job_dir) or {}).get("stopped_by")
            root_cause = {"stopped_by": name, **({"ranks_stopped_by": ranks} if ranks and ranks != name else {})}
        elif outcome.timed_out:
            error = f"timed out after timeout_s={cfg.timeout_s:g} s"
        else:
            # The root cause, not rank 0's own view (it fails too, later, when a peer dies).
            rank, error = failure_report(job_dir, outcome.returncodes, outcome.ended_first)
            root_cause = {"failed_rank": rank}
        update_summary(job_dir, status="failed", error=error, interrupted=bool(outcome.interrupted), **root_cause)
    summary = read_summary(job_dir) or {}
    changed = changed_sources(summary)
    if changed:
        summary = update_summary(job_dir, status="failed", error=changed)
    status = summary.get("status", "failed")  # no status: rank 0 died before writing one
    return record_outcome(
        job_dir, status, status=status, returncodes=outcome.returncodes, job_wall_s=round(outcome.wall_s, 3)
    )


def _report(tag: str, name: str, summary: dict, wall_s: float) -> None:
    status = summary.get("status", "failed")
    if status == "completed":
        log.info(f"{tag} {name}: completed in {wall_s:.1f} s, final loss {summary.get('final_loss', float('nan')):.4f}")
    else:
        first_line = (summary.get("error") or "").splitlines()[:1]
        log.error(f"{tag} {name}: {status} after {wall_s:.1f} s: {first_line[0] if first_line else ''}")


def _join_world(cfg: DictConfig, place: JobPlace, env: RankEnv, job: JobInfo) -> dict:
    """This process is already one rank of a world (torchrun's or a SLURM step's): train in-process.

    Under torchrun the process then exits (`os._exit`, as a spawned rank does),
    after rank 0 has logged the job's outcome. A SLURM task returns its status,
    so that Hydra's submitit launcher records the job and goes on with the sweep.
    """
    if place.sweeping and env.launcher != "slurm":
        raise SystemExit(f"under {env.launcher}, run one job per launch (drop -m); sweeps start their own rank worlds")
    if env.world_size != cfg.world_size:
        raise SystemExit(
            f"world_size={cfg.world_size} but the {env.launcher} launcher started {env.world_size} ranks; "
            f"set world_size={env.world_size} or start {cfg.world_size} ranks"
        )
    started = time.time()
    code = run_rank(rank_config(cfg), place.job_dir, env, job, started)
    if env.is_main:
        summary = record_outcome(place.job_dir, (read_summary(place.job_dir) or {}).get("status", "failed"))
        _report(place.tag, job.name, summary, time.time() - started)
    sys.stdout.flush()
    sys.stderr.flush()
    if env.launcher == "slurm":
        return {"status": (read_summary(place.job_dir) or {}).get("status", "failed") if env.is_main else "rank"}
    logging.shutdown()  # runner.log gets the lines above: os._exit skips the handlers' flush
    os._exit(code)
