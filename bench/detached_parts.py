"""B10: what `detached`'s extra time is made of, measured interleaved in one 2-rank world.

Arms, each step in a random order, each after a barrier, on the same micro-batches and model state:
- local: the baseline (one logging all-reduce per step);
- detached: one waited logging all-reduce per micro-batch, on FSDP's own process group;
- deferred: the same all-reduces, waited only at the step's end (no synchronisation point mid-step);
- own_group: the same all-reduces on a process group of their own (not queued behind FSDP's collectives);
- local_again: local's work again, the null control.
Each against local with the exact signed-rank test (`analysis.cost.randomization`), Holm-corrected.
If detached's extra time came from the synchronisation point, `deferred` would remove it; if from queueing
behind FSDP's reduce-scatters on the shared group, `own_group` would.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from runner.train.reduction import LossReducer, StepLoss

ARMS = ("local", "detached", "deferred", "own_group", "local_again")


class DeferredWait(LossReducer):
    """`detached`, its per-micro-batch all-reduces waited on at the step's end."""

    def start_step(self, valid_tokens: torch.Tensor) -> None:
        super().start_step(valid_tokens)
        self.pending = []

    def backward_loss(self, token_loss: torch.Tensor, sequence_valid_tokens: int) -> torch.Tensor:
        local = token_loss / self.valid_tokens
        self.pending.append(funcol.all_reduce(local.detach(), "sum", self.group))
        return local

    def finish_step(self) -> StepLoss:
        loss = float(sum(pending.wait() for pending in self.pending))
        return StepLoss(loss=loss, reported=loss, valid_tokens=int(self.valid_tokens.item()))


class OwnGroup(LossReducer):
    """`detached`, its logging all-reduces on a process group of their own."""

    def __init__(self, *args, own_group: dist.ProcessGroup, **kwargs):
        super().__init__(*args, **kwargs)
        self.own_group = own_group

    def backward_loss(self, token_loss: torch.Tensor, sequence_valid_tokens: int) -> torch.Tensor:
        local = token_loss / self.valid_tokens
        self.loss_sum += funcol.all_reduce(local.detach(), "sum", self.own_group)
        return local


def measure(steps: int) -> tuple[list[str], list[list[float]]] | None:
    """On every rank of a 2-rank world: [step][arm] world times of forward/backward; rank 0 returns them."""
    from runner.config import config_with, rank_config
    from runner.layout import ParallelLayout
    from runner.model.parallel import build_meshes
    from runner.modes import Reduction
    from runner.train.components import build_parts
    from runner.train.reduction import forward_backward

    cfg = rank_config(config_with({"grad_accum": 2, "train.steps": steps, "reduction": "local"}))
    parts = build_parts(cfg, build_meshes(ParallelLayout(2, 1, 2), "cpu"), torch.device("cpu"))
    reducers = {
        "local": parts.reducer(Reduction.local),
        "detached": parts.reducer(Reduction.detached),
        "deferred": DeferredWait(Reduction.detached, parts.group, 2),
        "own_group": OwnGroup(Reduction.detached, parts.group, 2, own_group=dist.new_group([0, 1])),
        "local_again": parts.reducer(Reduction.local),
    }
    times = torch.zeros(steps, len(ARMS), dtype=torch.float64)
    for step in range(1, steps + 1):
        micro_batches = parts.local_share(parts.batches(step))
        for index in np.random.default_rng([10, step]).permutation(len(ARMS)):
            dist.barrier()
            started = time.perf_counter()
            forward_backward(parts.model, micro_batches, reducers[ARMS[index]], parts.device)
            times[step - 1, index] = time.perf_counter() - started
            for param in parts.model.parameters():
                param.grad = None
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return (list(ARMS), times.tolist()) if dist.get_rank() == 0 else None


def run(quick: bool) -> tuple[str, str, str, str]:
    from analysis.cost.randomization import holm, signed_rank_shift
    from runner.testing.local_world import run_in_world

    steps, warmup = (20, 2) if quick else (1000, 5)
    _, times = run_in_world(measure, 2, steps, timeout_s=3600)[0]
    steady = dict(zip(ARMS, (np.array(times)[warmup:] * 1e3).T))
    # Each variant of detached against local, and against detached itself: what removing its
    # synchronisation point (deferred) or its shared process group (own_group) takes away.
    pairs = [(arm, "local") for arm in ARMS[1:]] + [("deferred", "detached"), ("own_group", "detached")]
    shifts = [signed_rank_shift(steady[arm] - steady[against]) for arm, against in pairs]
    adjusted = holm(np.array([s.p_value for s in shifts]))
    rows = "\n".join(
        f"| {arm} | {against} | {s.estimate:+.2f} | [{s.low:+.2f}, {s.high:+.2f}] | {p:.2g} |"
        for (arm, against), s, p in zip(pairs, shifts, adjusted)
    )
    base = steady["local"]
    body = f"""
Tiny model, W=2 gloo ranks, grad_accum=2, {steps} steps ({warmup} left out), the arms in a random order each step
(see the module docstring of `bench/detached_parts.py`); local's median forward+backward {np.median(base):.1f} ms.
Extra time against another arm on the same steps: the Hodges-Lehmann shift with the 95% CI of the exact signed-rank
test, Holm-corrected over the six comparisons.

| arm | against | extra ms | 95% CI | Holm p |
|---|---|---|---|---|
{rows}
"""
    return "B10", "What detached's extra time is made of", "python -m bench b10" + (" --quick" if quick else ""), body
