"""What each reduction mode costs, measured interleaved inside one rank world (`cost.modes`).

Jobs of a sweep run one after another, minutes apart, so comparing their step
times compares machine load as much as modes. Here every step runs each mode
in `cost.modes` (an "arm") on the same micro-batches and the same model state,
in a fresh random order (from `seed` and the step, the same on every rank),
each arm after a barrier:

    for each arm, in this step's order:
        barrier                       # the ranks start together: no skew in the timing
        forward/backward with the arm's LossReducer (and FSDP's mean or sum)
        t_arm = this rank's elapsed time
        keep the gradients if the arm is `reduction`, drop them otherwise
    cost_s[arm] = max over ranks of t_arm    # the world's time: one MAX all-reduce
    optimizer step on `reduction`'s gradients

So a change in machine load hits all arms of a step alike, and the analysis
compares arms step by step (paired). `fsdp_sum` and `scaled` issue exactly
`local`'s collectives: they are the null control, whose ratio to `local` must
be 1. At the start, `runner.measure.floor` times each kind of loss all-reduce alone
(`floor.json`), so the analysis can set each mode's overhead beside
`extra calls x floor`.

The collective counter is off in the timed arms (it costs a Python call per
op); step 1, a warm-up step left out of every figure, counts each arm's
collectives once (`cost_calls`).
"""

from __future__ import annotations

import json
import time

import numpy as np
import torch
import torch.distributed as dist

from runner.measure.floor import collective_floor
from runner.model.parallel import set_gradient_reduction
from runner.modes import Reduction, facts
from runner.record.metrics import MetricLogger, on_schedule
from runner.train.components import RankParts
from runner.train.counter import CollectiveCounter
from runner.train.meter import synchronize
from runner.train.optim import optimizer_step
from runner.train.outcome import TrainResult, divergence
from runner.train.reduction import forward_backward
from runner.train.rng import seed_step


def arm_order(modes: list[Reduction], seed: int, step: int) -> list[Reduction]:
    """This step's order of the arms: random, but the same on every rank."""
    rng = np.random.default_rng([seed, step, 0xC057])
    return [modes[i] for i in rng.permutation(len(modes))]


def _take_gradients(model: torch.nn.Module) -> list[torch.Tensor | None]:
    grads = [p.grad for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    return grads


def _put_gradients(model: torch.nn.Module, grads: list[torch.Tensor | None]) -> None:
    for p, grad in zip(model.parameters(), grads):
        p.grad = grad


def measure_cost(parts: RankParts, logger: MetricLogger | None) -> TrainResult:
    cfg, model, device = parts.cfg, parts.model, parts.device
    group = parts.group
    modes = [Reduction(m) for m in cfg.cost.modes]
    reducers = {m: parts.reducer(m) for m in modes}
    if cfg.cost.floor_calls:
        floor = collective_floor(group, device, calls=cfg.cost.floor_calls)
        if logger is not None:
            (logger.path.parent / "floor.json").write_text(json.dumps(floor, indent=2) + "\n")
    result = TrainResult(status="completed", steps_done=0, final_loss=None)
    for step in range(1, cfg.train.steps + 1):
        micro_batches = parts.local_share(parts.batches(step))
        parts.set_lr(step)
        order = arm_order(modes, cfg.seed, step)
        elapsed = torch.zeros(len(modes), dtype=torch.float64)
        calls = {}
        for mode in order:
            set_gradient_reduction(model, facts(mode).fsdp_reduction)
            seed_step(cfg.seed, step, parts.rank)  # every arm of the step draws the same dropout masks
            counter = CollectiveCounter(parts.meshes.group_kinds()) if step == 1 else None
            dist.barrier(group=group)
            started = time.perf_counter()
            if counter is not None:
                with counter:
                    step_loss = forward_backward(model, micro_batches, reducers[mode], device)
                calls[mode.value] = {kind: c["calls"] for kind, c in counter.take().items()}
            else:
                step_loss = forward_backward(model, micro_batches, reducers[mode], device)
            synchronize(device)
            elapsed[modes.index(mode)] = time.perf_counter() - started
            grads = _take_gradients(model)
            if mode == cfg.reduction:
                kept, trained_loss = grads, step_loss
        world_elapsed = elapsed.to(device)
        dist.all_reduce(world_elapsed, op=dist.ReduceOp.MAX, group=group)  # each arm's world time
        set_gradient_reduction(model, facts(cfg.reduction).fsdp_reduction)
        _put_gradients(model, kept)
        grad_norm, clip_coef = optimizer_step(
            model,
            parts.optimizer,
            cfg.optim.clip,
            reducers[cfg.reduction].grad_norm() if cfg.reduction in reducers else None,
        )

        result.steps_done, result.final_loss = step, trained_loss.loss
        record = {
            "step": step,
            "loss": trained_loss.loss,
            "grad_norm": grad_norm,
            "clip_coef": clip_coef,
            "valid_tokens": trained_loss.valid_tokens,
            "cost_s": {m.value: t for m, t in zip(modes, world_elapsed.tolist())},
            "cost_order": [m.value for m in order],
            "loss_collectives": {m.value: facts(m).loss_collectives(cfg.grad_accum) for m in modes}
            if step == 1
            else None,
            "cost_calls": calls or None,
        }
        if logger is not None:
            logger.log(record)
            if on_schedule(step, cfg.train.log_every, last=cfg.train.steps):
                arms = " ".join(f"{m}={t * 1e3:.1f}ms" for m, t in record["cost_s"].items())
                print(f"cost step {step}/{cfg.train.steps} | loss {record['loss']:.4f} | {arms}", flush=True)
        stop = divergence(step, trained_loss.loss, grad_norm)
        if stop is not None:
            result.status, result.error = "diverged", stop
            break
    return result
