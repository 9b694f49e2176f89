"""How a training step is measured: its timed phases, their collectives on sampled steps, the world's figures.

- A step has two timed phases, forward/backward and the optimizer update; the
  rank's step time is their sum (the gradient sketch runs between them,
  outside the time). The device is synchronised at the end of each phase.
- Collectives are counted on a sample of steps (`metrics.count_first`, every
  `metrics.count_every`-th, the last): their calls and bytes are the same
  every step, and counting costs a Python call per dispatched op.
- `arrival` is the wall clock when the step starts: the first collective is
  the valid-token all-reduce, so the spread of the ranks' arrivals is the
  step's peer skew. Clocks agree on one machine; across nodes they are only
  as close as NTP keeps them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from runner.config import MetricsConfig, counted_step
from runner.train.counter import CollectiveCounter


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepMeter:
    def __init__(self, device: torch.device, metrics: MetricsConfig, steps: int, group_kinds: dict | None = None):
        self.device = device
        self.metrics = metrics
        self.steps = steps
        self.counter = CollectiveCounter(group_kinds) if metrics.count_comm else None

    def start(self, step: int) -> None:
        self.counting = self.counter is not None and counted_step(step, self.steps, self.metrics)
        self.arrival = time.time()  # wall clock, comparable between ranks
        self.elapsed = 0.0  # the timed phases' seconds on this rank
        self.comm: dict[str, dict] = {}  # per counted phase: {kind: {calls, bytes, seconds}}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        with self.counter if self.counting else nullcontext():
            yield
        synchronize(self.device)
        self.elapsed += time.perf_counter() - started
        if self.counting:
            self.comm[name] = self.counter.take()

    def own_row(self) -> torch.Tensor:
        """[step time, arrival] of this rank, on the device (no copy back per step on a GPU)."""
        return torch.tensor([self.elapsed, self.arrival], dtype=torch.float64, device=self.device)


def world_gather(rows: torch.Tensor, group: dist.ProcessGroup, device: torch.device) -> torch.Tensor:
    """Every rank's [steps, 2 + K] rows [elapsed, arrival, sketch partial sums] in one all-gather:
    per step [max over ranks of elapsed, spread of arrival, the sketch: sum over ranks].

    The sums run in rank order, so every rank gets the same bits.
    """
    gathered = [torch.empty_like(rows, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, rows.to(device), group=group)
    table = torch.stack(gathered).cpu()  # [rank, step, field]
    arrival = table[:, :, 1]
    return torch.cat(
        [table[:, :, :1].amax(dim=0), (arrival.amax(dim=0) - arrival.amin(dim=0))[:, None], table[:, :, 2:].sum(dim=0)],
        dim=1,
    )
