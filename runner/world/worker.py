"""One rank of a job: `python -m runner.world.worker JOB_DIR --name NAME --group GROUP --spawned-at T`.

`runner.sweep.spawn` starts one such process per rank; a job that joins a torchrun
world calls `run_rank` in-process instead. Rank 0 writes summary.json. A rank
ends with `os._exit` after a barrier, the process group's destruction and W&B's
finish, so no rank aborts at interpreter exit (torch's ranks sometimes abort in
their exit handlers, after all work is done, when left to exit on their own).
"""

from __future__ import annotations

import time

PROCESS_STARTED = time.time()  # before the heavy imports, to split launch from init time

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

if TYPE_CHECKING:
    from runner.config import RunConfig


@dataclass(frozen=True)
class JobInfo:
    name: str  # W&B run name: the layout and the job's overrides
    group: str  # W&B group: the sweep directory's name
    spawned_at: float | None = None  # epoch seconds when the launcher started this rank


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    # One line per warning, so the launcher can show each distinct one once per sweep.
    return f"[warning] {category.__name__}: {message} ({Path(filename).name}:{lineno})\n"


def write_error_record(job_dir: Path, rank: int, error: BaseException) -> None:
    """logs/rank<r>.error.json: when and why this rank failed, with its traceback (as torchelastic's @record).

    The launcher takes the earliest record as the job's root cause: a rank
    whose peer died fails too, later, in its next collective.
    """
    record = {
        "rank": rank,
        "time": time.time(),
        "error": f"{type(error).__name__}: {error}",
        "traceback": "".join(traceback.format_exception(error)),
    }
    path = job_dir / "logs" / f"rank{rank}.error.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))


def run_rank(cfg: RunConfig, job_dir: Path, env, job: JobInfo, process_started: float) -> int:
    """Train, or measure the modes' cost when `cost.modes` is set, as rank `env.rank`; returns the exit code.

    Rank 0 writes summary.json and the metrics. `cfg` is the typed config (`runner.config.rank_config`).
    """
    import torch

    from runner.layout import ParallelLayout
    from runner.measure.cost import measure_cost
    from runner.model.parallel import build_meshes
    from runner.record import checkpoints
    from runner.record.metrics import MetricLogger
    from runner.record.summary import update_summary, versions
    from runner.record.wandb_run import start_wandb_run
    from runner.train import checkpoint
    from runner.train.components import build_parts
    from runner.train.loop import train
    from runner.train.outcome import peak_rss_mib
    from runner.train.rng import seed_step
    from runner.world.env import init_world, leave_world, resolve_device_type

    layout = ParallelLayout.from_config(cfg)
    summary = {
        "run_name": job.name,
        "group": job.group,
        "reduction": cfg.reduction.value,
        "world_size": cfg.world_size,
        "dp": layout.dp,
        "dp_replicate": layout.dp_replicate,
        "sp": layout.sp,
        "tp": layout.tp,
        "pp": layout.pp,
        "grad_accum": cfg.grad_accum,
        "layout": str(layout),
        "launcher": env.launcher,
        "wall_s": {"launch": None if job.spawned_at is None else round(process_started - job.spawned_at, 3)},
    }
    logger = None
    marks = {"start": process_started}
    init_marks = [time.time()]  # the init phase split: imports, process group and meshes, W&B
    try:
        device_type = resolve_device_type(cfg.device.value, torch.cuda.is_available())
        device = init_world(env, device_type, cfg.dist.timeout_s)
        summary["backend"] = "nccl" if device_type == "cuda" else "gloo"
        summary["device"] = torch.cuda.get_device_name(device) if device_type == "cuda" else "cpu"
        meshes = build_meshes(layout, device_type)
        init_marks.append(time.time())
        if env.is_main:
            training = not cfg.cost.modes  # a cost job keeps no checkpoints
            resumes = None
            if training and cfg.train.checkpoint_every:  # the newest checkpoint whose files are whole (the ranks'
                resumes, passed = checkpoint.newest_loadable(job_dir)  # loop picks the same one)
                for line in passed:
                    print(line + (f"; resuming from step {resumes[0]}" if resumes else "; starting anew"), flush=True)
                # the steps after the checkpoint's (all of them, without one) are computed again
                checkpoints.truncate_metrics(job_dir / "metrics.jsonl", resumes[0] if resumes else 0)
            run = start_wandb_run(
                cfg,
                job_dir,
                name=job.name,
                group=job.group,
                extra_config={"dp": layout.dp, "layout": str(layout)},
                resumes=resumes is not None,
            )
            if run is not None:
                summary["wandb_run_id"] = run.id
            charted_every = cfg.wandb.log_every if run is not None else 1  # read only when there is a W&B run
            logger = MetricLogger(job_dir / "metrics.jsonl", run, wandb_every=charted_every)
        marks["init"] = time.time()
        phases = zip([process_started, *init_marks], [*init_marks, marks["init"]])
        imports, process_group, wandb_init = (b - a for a, b in phases)
        summary["init_s"] = {
            "imports": round(imports, 3),
            "process_group": round(process_group, 3),
            "wandb": round(wandb_init, 3),
        }
        seed_step(cfg.seed, 0, env.rank)  # whatever set-up draws; each step seeds its own (runner.train.rng)
        parts = build_parts(cfg, meshes, device)
        summary.update(parts.provenance())
        measured = summary.get("all_reduce_backward")
        if env.is_main and measured and not measured["as_expected"]:
            print(
                f"[warning] {measured['implementation']}'s backward gave {measured['per_rank']} per rank with torch "
                f"{measured['torch']}, not {measured['expected']:g}: this run's gradient is not what the modes' "
                "facts say",
                flush=True,
            )
        # the one place that chooses
        result = measure_cost(parts, logger) if cfg.cost.modes else train(parts, logger, job_dir)
        result.peak_rss_mib = peak_rss_mib(parts.group)
        marks["train"] = time.time()
        summary.update(
            status=result.status, error=result.error, steps_done=result.steps_done, final_loss=result.final_loss
        )
        summary["peak_rss_mib"] = result.peak_rss_mib
        for field in ("resumed_from_step", "final_state_sha256", "stopped_by"):
            if getattr(result, field, None) is not None:
                summary[field] = getattr(result, field)
        if getattr(result, "reported_not_finite", None):
            steps = result.reported_not_finite
            summary["reported_loss_not_finite"] = {"first_step": steps[0], "steps": len(steps)}
        leave_world()
        if logger is not None:
            logger.close()
        marks["teardown"] = time.time()
        code = 0
    except BaseException as error:  # KeyboardInterrupt too: record it, then exit non-zero
        if env.is_main:  # rank 0's output is the terminal's: one line; the launcher then names the root cause
            first = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
            print(
                f"rank {env.rank}: {type(error).__name__}: {first} (its traceback: logs/rank{env.rank}.error.json)",
                file=sys.stderr,
                flush=True,
            )
        else:  # the other ranks' output is their log's alone
            traceback.print_exc()
        summary.update(status="failed", error=f"rank {env.rank}: {type(error).__name__}: {error}")
        write_error_record(job_dir, env.rank, error)
        if logger is not None:
            logger.close()
        code = 1
    previous = "start"
    for phase in ("init", "train", "teardown"):
        if phase in marks:
            summary["wall_s"][phase] = round(marks[phase] - marks[previous], 3)
            previous = phase
    if env.is_main:
        update_summary(job_dir, versions=versions(), **summary)
    return code


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_dir", type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--spawned-at", type=float, default=None)
    args = parser.parse_args(argv)
    warnings.formatwarning = one_line_warning

    from runner.config import load_run_config, rank_config
    from runner.world.env import rank_env

    env = rank_env()
    if env is None:
        sys.exit(
            "runner.world.worker runs as one rank of a world: RANK and WORLD_SIZE must be set (runner.sweep.spawn sets them)"
        )
    cfg = rank_config(load_run_config(args.job_dir / "config.yaml"))
    code = run_rank(cfg, args.job_dir, env, JobInfo(args.name, args.group, args.spawned_at), PROCESS_STARTED)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
