"""The config keys that cannot change what a run computes.

A run's trajectory (its losses, gradients and parameters at every step) depends on the model, the data, the
objective, the optimizer, the layout, the mode and the seed. These keys change none of it: how long it runs
(`train.steps`: the learning-rate schedule does not depend on it, so runs of different lengths agree on the
steps they share), how often it prints, checkpoints or logs, where and whether it logs to W&B, when it is
killed, whether and how often its collectives are counted and its gradients gathered for the analysis, and
the cost job's own settings. The analysis never splits a comparison group on them, and a test runs a job
with every one of them changed and asserts the same losses and grad norms, bit for bit.

`dist.oversubscribe` is not among them: it sets the ranks' thread counts, which can change float results.
"""

from __future__ import annotations

OUTSIDE_TRAJECTORY = (
    "train.steps",
    "train.log_every",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "timeout_s",
    "dist.timeout_s",
    "metrics.count_comm",
    "metrics.count_first",
    "metrics.count_every",
    "metrics.gather_every",
    "wandb.",
    "cost.",
)


def outside_trajectory(key: str) -> bool:
    """Whether the dotted config key `key` is one of OUTSIDE_TRAJECTORY (or under one ending in '.')."""
    return any(key == outside or (outside.endswith(".") and key.startswith(outside)) for outside in OUTSIDE_TRAJECTORY)
