"""The training loop of one rank, readable top to bottom.

Every rank runs this same loop on its share of each step's global batch; rank
0 alone writes metrics (JSONL + W&B) and progress lines.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from runner.comm import CollectiveCounter, add_counts
from runner.data import GlobalBatches, load_documents, local_micro_batches
from runner.gradients import GradientSketch, clip_gradients
from runner.layout import ParallelLayout
from runner.metrics import MetricLogger, progress_line
from runner.model import build_model
from runner.optim import build_optimizer, lr_at, set_lr
from runner.parallel import Meshes, parallelize
from runner.reduction import LossReducer, forward_backward


@dataclass
class TrainResult:
    status: str  # "completed" or "diverged"
    steps_done: int
    final_loss: float | None
    error: str | None = None


def train(cfg: DictConfig, meshes: Meshes, device: torch.device, logger: MetricLogger | None) -> TrainResult:
    layout = ParallelLayout.from_config(cfg)
    rank_share = dict(dp=layout.dp, dp_rank=meshes.dp_rank, sp=layout.sp, sp_rank=meshes.sp_rank)
    group = meshes.world_group
    batches = GlobalBatches(
        load_documents(cfg.data),
        seq_len=cfg.train.seq_len,
        global_batch=cfg.train.global_batch,
        seed=cfg.seed,
        packing=cfg.data.packing,
    )
    model = parallelize(build_model(cfg.model, cfg.seed).to(device), meshes, cfg.reduction)
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    reducer = LossReducer(cfg.reduction, group, cfg.grad_accum)
    sketch = GradientSketch(model, cfg.metrics.sketch_dim, cfg.metrics.sketch_seed) if cfg.metrics.sketch_dim else None
    counter = CollectiveCounter() if cfg.metrics.count_comm else None
    counting = counter if counter is not None else nullcontext()

    steps = cfg.train.steps
    tokens = 0
    result = TrainResult(status="completed", steps_done=0, final_loss=None)
    for step in range(1, steps + 1):
        micro_batches = local_micro_batches(batches(step), grad_accum=cfg.grad_accum, **rank_share)
        lr = lr_at(step, cfg.optim)
        set_lr(optimizer, lr)

        started = time.perf_counter()
        with counting:
            step_loss = forward_backward(model, micro_batches, reducer, device)
        backward_done = time.perf_counter()
        # FSDP2 on one mesh moves parameters and gradients with all-gathers and
        # reduce-scatters, Ulysses moves activations with all-to-alls: every
        # all-reduce of forward/backward is the loss's (N and the mode's own).
        forward_backward_comm = counter.take() if counter is not None else {}
        # Measurement only: outside the counter and the step time.
        grad_sketch = sketch(group) if sketch is not None else None
        optimizer_started = time.perf_counter()
        with counting:
            grad_norm, clip_coef = clip_gradients(model, cfg.optim.clip)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_time = (backward_done - started) + (time.perf_counter() - optimizer_started)

        tokens += step_loss.valid_tokens
        comm = add_counts(forward_backward_comm, counter.take()) if counter is not None else {}
        loss_comm = forward_backward_comm.get("all_reduce", {"calls": 0, "bytes": 0, "seconds": 0.0})
        result.steps_done, result.final_loss = step, step_loss.loss
        record = {
            "step": step,
            "dp": layout.dp,
            "sp": layout.sp,
            "tokens": tokens,
            "valid_tokens": step_loss.valid_tokens,
            "loss": step_loss.loss,
            "reported_loss": step_loss.reported,
            "grad_norm": grad_norm,
            "clip_coef": clip_coef,
            "lr": lr,
            "step_time_s": step_time,
            "tokens_per_s": step_loss.valid_tokens / step_time,
            "comm": comm,
            "loss_comm": loss_comm if counter is not None else {},
            "grad_sketch": grad_sketch,
        }
        if logger is not None:
            logger.log(record)
            if step == 1 or step % cfg.train.log_every == 0 or step == steps:
                print(progress_line(record, steps), flush=True)
        # The loss and the norm are world-reduced, so every rank stops at the same step.
        if not (math.isfinite(step_loss.loss) and math.isfinite(grad_norm)):
            result.status = "diverged"
            result.error = f"not finite at step {step}: loss {step_loss.loss}, grad_norm {grad_norm}"
            if logger is not None:
                print(f"diverged: {result.error}", flush=True)
            break
    return result
