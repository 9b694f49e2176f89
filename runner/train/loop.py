"""The training loop of one rank, readable top to bottom.

Every rank runs this same loop on its share of each step's global batch; rank
0 alone writes metrics (JSONL + W&B) and progress lines. A job with
`cost.modes` set measures the modes' cost instead (`runner.measure.cost`).

What a step's timing means:
- `step_time_s` is the world's step time: the slowest rank's forward/backward
  plus optimizer time. A rank that waits in a collective for a slower peer, or
  for rank 0's logging, has that wait in its own time, so the maximum holds it.
- `peer_skew_s` is the spread of the ranks' wall-clock arrival at the step's
  first collective (the valid-token all-reduce): how long the earliest rank
  waited for the latest there. Clocks agree on one machine; across nodes they
  are only as close as NTP keeps them.

Each rank keeps its step times, arrivals and gradient-sketch shares, and one
all-gather every `metrics.gather_every` steps (and after the last) turns them
into those world figures; rank 0 writes the steps' records then. A job that
fails writes its pending records with the world figures null (a rank 0 killed
outright loses them: at most gather_every - 1 steps).

Collectives are counted on a sample of steps (`metrics.count_first` and every
`metrics.count_every`-th, and the last): their calls and bytes are the same
every step, and counting costs a Python call per dispatched op.
"""

from __future__ import annotations

import math
import resource
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from runner.config import counted_step
from runner.data.batches import GlobalBatches, load_documents, local_micro_batches, micro_batch_token_range
from runner.layout import ParallelLayout
from runner.measure.comm import CollectiveCounter, add_counts
from runner.model.decoder import build_model
from runner.model.parallel import Meshes, parallelize
from runner.record.metrics import MetricLogger, on_schedule, progress_line
from runner.train import fault
from runner.train.gradients import GradientSketch, clip_gradients
from runner.train.optim import build_optimizer, lr_at, set_lr
from runner.train.reduction import LossReducer, forward_backward

NO_COMM = {"calls": 0, "bytes": 0, "seconds": 0.0}


@dataclass
class TrainResult:
    status: str  # "completed" or "diverged"
    steps_done: int
    final_loss: float | None
    error: str | None = None
    peak_rss_mib: list[float] | None = None  # per rank, filled in at the end of training


def peak_rss_mib(group: dist.ProcessGroup) -> list[float]:
    """Every rank's peak resident memory so far (MiB), in rank order (one all-gather)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    ranks: list[float | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(ranks, round(own, 1), group=group)
    return ranks


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


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Trainer:
    """The model, data, optimizer and measurement of one rank; `step(t)` runs optimizer step t."""

    def __init__(self, cfg: DictConfig, meshes: Meshes, device: torch.device, logger: MetricLogger | None = None):
        self.cfg = cfg
        # The per-step reads go to plain dataclasses: 50 ns an attribute, where a DictConfig takes 20 us.
        self.settings = OmegaConf.to_object(cfg)
        self.device = device
        self.logger = logger
        self.layout = ParallelLayout.from_config(cfg)
        self.group = meshes.world_group
        self.rank = dist.get_rank(self.group)
        self.rank_share = dict(dp=self.layout.dp, dp_rank=meshes.dp_rank, sp=self.layout.sp, sp_rank=meshes.sp_rank)
        self.batches = GlobalBatches(
            load_documents(cfg.data),
            seq_len=cfg.train.seq_len,
            global_batch=cfg.train.global_batch,
            seed=cfg.seed,
            packing=cfg.data.packing,
        )
        self.model = parallelize(build_model(cfg.model, cfg.seed).to(device), meshes, cfg.reduction, cfg.mp)
        self.optimizer = build_optimizer(self.model.parameters(), cfg.optim)
        self.reducer = LossReducer(cfg.reduction, self.group, cfg.grad_accum, sp=self.layout.sp)
        metrics = cfg.metrics
        self.sketch = (
            GradientSketch(self.model, metrics.sketch_dim, metrics.sketch_seed) if metrics.sketch_dim else None
        )
        self.counter = CollectiveCounter() if metrics.count_comm else None
        self.tokens = 0
        self.pending: list[tuple[dict, torch.Tensor]] = []  # records awaiting their world figures, with this rank's row

    def step(self, step: int) -> dict:
        """Optimizer step `step` (1-based) on this rank; returns its metrics record (logged on rank 0)."""
        cfg = self.settings
        batch = self.batches(step)
        micro_batches = local_micro_batches(batch, grad_accum=cfg.grad_accum, **self.rank_share)
        lr = lr_at(step, cfg.optim)
        set_lr(self.optimizer, lr)
        counter = (
            self.counter if self.counter is not None and counted_step(step, cfg.train.steps, cfg.metrics) else None
        )
        counting = counter if counter is not None else nullcontext()

        fault.before_step(cfg.fault, self.rank, step)
        arrival = time.time()  # wall clock, comparable between ranks: the first collective is N's all-reduce
        started = time.perf_counter()
        with counting:
            step_loss = forward_backward(self.model, micro_batches, self.reducer, self.device)
        synchronize(self.device)
        backward_done = time.perf_counter()
        fault.after_backward(cfg.fault, self.rank, step, self.model)
        # FSDP2 on one mesh moves parameters and gradients with all-gathers and
        # reduce-scatters, Ulysses moves activations with all-to-alls: every
        # all-reduce of forward/backward is the loss's (N and the mode's own).
        forward_backward_comm = counter.take() if counter is not None else None
        # Measurement only: outside the counter and the step time (summed over ranks at the next gather).
        sketch_part = self.sketch.partial_sums() if self.sketch is not None else None
        optimizer_started = time.perf_counter()
        with counting:
            grad_norm, clip_coef = clip_gradients(self.model, cfg.optim.clip)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        synchronize(self.device)
        rank_step_time = (backward_done - started) + (time.perf_counter() - optimizer_started)
        # This rank's row for the next gather, on the device (no copy back per step on a GPU).
        own = torch.tensor([rank_step_time, arrival], dtype=torch.float64, device=self.device)

        self.tokens += step_loss.valid_tokens
        fewest, most = micro_batch_token_range(batch, dp=self.layout.dp, grad_accum=cfg.grad_accum)
        record = {
            "step": step,
            "dp": self.layout.dp,
            "sp": self.layout.sp,
            "tokens": self.tokens,
            "valid_tokens": step_loss.valid_tokens,
            "micro_batch_tokens_min": fewest,
            "micro_batch_tokens_max": most,
            "loss": step_loss.loss,
            "reported_loss": step_loss.reported,
            "grad_norm": grad_norm,
            "clip_coef": clip_coef,
            "lr": lr,
            "step_time_s": None,  # the world figures: filled in by the next gather
            "rank_step_time_s": rank_step_time,
            "peer_skew_s": None,
            "tokens_per_s": None,
            # Sampled steps only (null elsewhere): calls and bytes are the same every step.
            "comm": add_counts(forward_backward_comm, counter.take()) if counter is not None else None,
            "loss_comm": forward_backward_comm.get("all_reduce", NO_COMM) if counter is not None else None,
            "grad_sketch": None,
        }
        self.pending.append((record, own if sketch_part is None else torch.cat([own, sketch_part])))
        if self.logger is not None:
            self.logger.hold(record)
        if step % cfg.metrics.gather_every == 0 or step == cfg.train.steps:
            self.gather_pending()
        return record

    def gather_pending(self) -> None:
        """The world figures of the steps since the last gather (one all-gather; every rank calls it at the same step)."""
        if not self.pending:
            return
        world = world_gather(torch.stack([row for _, row in self.pending]), self.group, self.device).tolist()
        for (record, _), (step_time, skew, *sketch) in zip(self.pending, world):
            record.update(step_time_s=step_time, peer_skew_s=skew, tokens_per_s=record["valid_tokens"] / step_time)
            record["grad_sketch"] = sketch if self.sketch is not None else None
        self.pending = []
        if self.logger is not None:
            for record in self.logger.write_held():
                if on_schedule(record["step"], self.settings.train.log_every, last=self.settings.train.steps):
                    print(progress_line(record, self.settings.train.steps), flush=True)


def train(cfg: DictConfig, meshes: Meshes, device: torch.device, logger: MetricLogger | None) -> TrainResult:
    if cfg.cost.modes:
        from runner.measure.cost import measure_cost

        result = measure_cost(cfg, meshes, device, logger)
        result.peak_rss_mib = peak_rss_mib(meshes.world_group)
        return result
    trainer = Trainer(cfg, meshes, device, logger)
    result = TrainResult(status="completed", steps_done=0, final_loss=None)
    for step in range(1, cfg.train.steps + 1):
        record = trainer.step(step)
        result.steps_done, result.final_loss = step, record["loss"]
        # The loss and the norm are world-reduced, so every rank stops at the same step.
        if not (math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"])):
            result.status = "diverged"
            result.error = f"not finite at step {step}: loss {record['loss']}, grad_norm {record['grad_norm']}"
            if logger is not None:
                print(f"diverged: {result.error}", flush=True)
            break
    trainer.gather_pending()  # a diverged step's world figures (every rank stops at the same step)
    result.peak_rss_mib = peak_rss_mib(trainer.group)
    return result
