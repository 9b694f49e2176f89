"""The physical floor of a loss collective: a scalar all-reduce timed alone, after a barrier.

Each call is timed on every rank from the barrier's exit to the call's end,
and a call's time is the slowest rank's (one MAX all-reduce of all the times
at the end). The barrier lines the ranks up first, so what is timed is the
collective's own latency, not a wait for a late peer (which is skew, see
`peer_skew_s`). Three kinds, the ones the reduction modes issue:

- `plain`: `dist.all_reduce` of a scalar (the valid-token count N);
- `functional`: `funcol.all_reduce` of a scalar, waited on (detached's and
  the per-step logging all-reduce);
- `differentiable`: `funcol.all_reduce` of a scalar leaf, then backward:
  one forward and one backward all-reduce (what `sum` adds per micro-batch).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def _timed_calls(call: Callable[[], None], calls: int, group: dist.ProcessGroup, device: torch.device) -> torch.Tensor:
    times = torch.empty(calls, dtype=torch.float64)
    for index in range(calls):
        dist.barrier(group=group)
        started = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times[index] = time.perf_counter() - started
    slowest = times.to(device)  # NCCL reduces device tensors only
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return slowest.cpu()


def collective_floor(group: dist.ProcessGroup, device: torch.device, calls: int = 1000, warmup: int = 20) -> dict:
    """{kind: {median_s, p90_s, calls}} for the three kinds above, on this group's backend."""
    value = torch.ones((), device=device)

    def plain() -> None:
        dist.all_reduce(value.clone(), group=group)

    def functional() -> None:
        funcol.all_reduce(value, "sum", group).wait()

    def differentiable() -> None:
        leaf = value.clone().requires_grad_(True)
        funcol.all_reduce(leaf, "sum", group).backward()

    floor = {}
    for name, call in (("plain", plain), ("functional", functional), ("differentiable", differentiable)):
        _timed_calls(call, warmup, group, device)
        times = _timed_calls(call, calls, group, device)
        floor[name] = {
            "median_s": float(times.median()),
            "p90_s": float(times.quantile(0.9)),
            "calls": calls,
        }
    floor["world_size"] = dist.get_world_size(group)
    floor["backend"] = dist.get_backend(group)
    return floor
