"""The rank-0 Weights & Biases run of a job (offline by default).

group = the sweep directory's name, job_type = the run's mode label, name = the
job's overrides, config = the resolved run config. Tokens are the step
metric, so runs that split the same global batch differently line up. The
run reads its API key from the environment itself; nothing here copies it.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any

from runner.config import RunConfig, config_container
from runner.modes import run_mode_label


def has_wandb_credentials() -> bool:
    """An API key for `wandb.mode=online`: WANDB_API_KEY, or the ~/.netrc entry `wandb login` writes."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def start_wandb_run(cfg: RunConfig, job_dir: Path, *, name: str, group: str, extra_config: dict[str, Any]):
    """A live wandb Run, or None when `wandb.mode=disabled`."""
    if cfg.wandb.mode.value == "disabled":
        return None
    import wandb

    config = config_container(cfg)
    config.update(extra_config)
    run = wandb.init(
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
