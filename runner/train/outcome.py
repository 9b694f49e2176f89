"""How a rank's loop ended: the result both loops return, their one divergence rule, and peak memory."""

from __future__ import annotations

import math
import resource
from dataclasses import dataclass, field

import torch.distributed as dist


@dataclass
class TrainResult:
    status: str  # "completed" or "diverged"
    steps_done: int
    final_loss: float | None
    error: str | None = None
    peak_rss_mib: list[float] | None = None  # per rank, filled in at the end of the loop
    # Steps whose reported loss (what the mode or rule logs) was not finite, e.g. a rule's 0 / 0 over a
    # micro-batch without targets: training goes on (the gradient decides divergence), the record says so.
    reported_not_finite: list[int] = field(default_factory=list)


def divergence(step: int, loss: float, grad_norm: float) -> str | None:
    """Why the loop must stop at `step` (the loss or the grad norm is not finite), or None.

    Both are reduced over the world, so every rank stops at the same step.
    """
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return None
    return f"not finite at step {step}: loss {loss}, grad_norm {grad_norm}"


def peak_rss_mib(group: dist.ProcessGroup) -> list[float]:
    """Every rank's peak resident memory so far (MiB), in rank order (one all-gather)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    ranks: list[float | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(ranks, round(own, 1), group=group)
    return ranks
