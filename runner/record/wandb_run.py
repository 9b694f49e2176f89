"""The rank-0 Weights & Biases run of a job (offline by default).

group = the sweep directory's name, job_type = the run's mode label, name = the
job's overrides, config = the resolved run config. Tokens are the step
metric, so runs that split the same global batch differently line up. The
run reads its API key from the environment itself; nothing here copies it.

A checkpointing job (`train.checkpoint_every` > 0) keeps one W&B run across the attempts that resume it:
its first attempt draws a run id (`wandb.sdk.lib.runid.generate_id`, W&B's own) and writes it into the
job's checkpoints folder (`RUN_ID_FILE`, kept with the checkpoints when a rerun resumes, cleared or moved
aside with them otherwise); an attempt that resumes from a checkpoint reads it back and starts the run with
`id=` that id and `resume="allow"`. Online, W&B resumes the run (its history continues after its last
step). Offline, each attempt writes its own `offline-run-<time>-<id>` folder, and the run record of a
resumed one says `resume: true` (wandb's `InterfaceBase._make_run`, `wandb/sdk/interface/interface.py`):
`wandb sync` uploads the folders of one run id in order of their start time, the later ones appended to
the first (docs/wandb.md).
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any

from runner.config import RunConfig, config_container
from runner.modes import run_mode_label
from runner.record import checkpoints

RUN_ID_FILE = "wandb_run_id"  # in the job's checkpoints folder: the W&B run its checkpoints continue


def has_wandb_credentials() -> bool:
    """An API key for `wandb.mode=online`: WANDB_API_KEY, or the ~/.netrc entry `wandb login` writes."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def checkpointed_run_id(job_dir: Path, *, resumes: bool) -> str:
    """The W&B run id of a checkpointing job: the one written by the attempt that started the run when this
    attempt resumes from its checkpoint (a new one if none was written); otherwise a new one, written down
    for the attempts that will resume this one."""
    path = checkpoints.checkpoints_dir(job_dir) / RUN_ID_FILE
    if resumes and path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    from wandb.sdk.lib.runid import generate_id

    run_id = generate_id()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(run_id + "\n")
    tmp.replace(path)
    return run_id


def start_wandb_run(
    cfg: RunConfig, job_dir: Path, *, name: str, group: str, extra_config: dict[str, Any], resumes: bool = False
):
    """A live wandb Run, or None when `wandb.mode=disabled`. `resumes`: this attempt resumes the job from its
    checkpoint, so it resumes the W&B run its checkpoints continue (a checkpointing job's run id is stable)."""
    if cfg.wandb.mode.value == "disabled":
        return None
    import wandb

    config = config_container(cfg)
    config.update(extra_config)
    run_id, resume = None, None  # W&B draws a new id, and starts a new run
    if cfg.train.checkpoint_every and not cfg.cost.modes:  # a cost job keeps no checkpoints
        run_id = checkpointed_run_id(job_dir, resumes=resumes)
        resume = "allow" if resumes else None
    run = wandb.init(
        id=run_id,
        resume=resume,
        project=cfg.wandb.project,
        entity=cfg.wandb.entity,
        group=group,
        job_type=run_mode_label(cfg),
        name=name,
        config=config,
        dir=str(job_dir),
        mode=cfg.wandb.mode.value,
        settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
    )
    run.define_metric("tokens")
    run.define_metric("*", step_metric="tokens")
    return run


NESTED = ("comm", "loss_comm", "cost_s", "cost_order")  # flattened below
# In every run's W&B config already (dp, sp), or inputs to the analysis that no chart shows
# (the K sketch projections): metrics.jsonl keeps them, W&B does not chart them (30% fewer keys a step).
NOT_CHARTED = ("dp", "sp", "grad_sketch")


def wandb_payload(record: dict[str, Any]) -> dict[str, Any]:
    """A metrics.jsonl record flattened for W&B charts: comm/<kind>/<field>, loss_comm/<field>, cost_s/<mode>."""
    payload = {key: value for key, value in record.items() if key not in NESTED + NOT_CHARTED}
    for kind, counts in (record.get("comm") or {}).items():  # null on steps that were not counted
        for field, value in counts.items():
            payload[f"comm/{kind}/{field}"] = value
    for field, value in (record.get("loss_comm") or {}).items():
        payload[f"loss_comm/{field}"] = value
    for mode, seconds in (record.get("cost_s") or {}).items():
        payload[f"cost_s/{mode}"] = seconds
    return payload
