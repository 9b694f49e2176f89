"""xtuner v1's language-model cross-entropy: as released (loss_reduction token, sample, square), as the RFC
proposes (its all-reduce dropped), and as its open PR #1968 changes it.

A paraphrase: the package index's xtuner (0.2.0) does not contain xtuner/v1. Read at InternLM/xtuner:

Released (b934f462095c1e750229de35367c50ae36caa786), xtuner/v1/loss/ce_loss.py, `LMHeadLossContext`:
- `build_batches` (once per step over its micro-batches: this rule's `start_step`): each target's
  weight is 1 (loss_reduction "token"), 1 / n_s ("sample") or 1 / sqrt(n_s) ("square"), n_s the valid
  targets of its sample (a row here: one document; xtuner gathers the shifted labels over the SP mesh
  to count it); 0 where the label is ignored. The weights' sum over the step's micro-batches is
  all-reduced (SUM, WORLD, in place, outside autograd): the global denominator D (N for "token");
  every weight is divided by D + 1e-12.
- `loss_fn`: sum of token cross-entropy x weight (0 x the logits' sum where the shard has no target).
- `forward`: `all_reduce(loss, op=SUM, group=WORLD)` from `torch.distributed.nn.functional`:
  differentiable, its backward a SUM (graph_all_reduce=torch_nn), so each rank's loss receives W;
  FSDP2 keeps its mean (custom.fsdp_reduce=mean): (1/W) W dL = grad L for "token".
- xtuner/v1/model/base.py L1263-1265 (at b934f462): the logged loss is the micro-batches' (reduced)
  losses summed, then `dist.all_reduce(reduced_llm_loss.div_(world_size))`: a mean over ranks of a value
  every rank already holds, L: logging only.

RFC #1335 (at 7b1246a3e3fcb156a6c579859061be78d8d520b7: base_loss_ctx.py L156, train_engine.py
L336-337) proposes dropping that all-reduce: `rfc_without_all_reduce` backpropagates the local S_rsm / N
under FSDP's mean, grad L / W; the engine's mean of the logged loss, kept, then logs L / W.

PR #1968 (head 3ce8fea8d69a9d31f42aca3620ac7efd540ff3bd, "[FSDP][Loss] Reduce-sum gradient reduction
with per-batch aux-loss hub", open): the all-reduce dropped and FSDP's reduction a SUM
(`set_gradient_divide_factor(1.0)` with `set_force_sum_reduction_for_comms(True)`; custom.fsdp_reduce=sum):
sum_rsm d(S_rsm / N) = grad L; each rank displays its own mean, `calibrate()` = its backward loss x
D / (this rank's weight sum, clamped at 1e-12), with no cross-rank all-reduce; the runner averages the
ranks' displays as `reported_loss`.

"sample" and "square" weigh rows equally (or by sqrt of their counts), not tokens: another gradient
than grad L whenever rows hold unequal counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.nn.functional import all_reduce  # as ce_loss.py imports it

from runner.train.custom_rule import custom_rule
from runner.train.upstream import Source

RELEASED = Source(
    "InternLM/xtuner",
    "b934f462095c1e750229de35367c50ae36caa786",
    (
        "xtuner/v1/loss/ce_loss.py: LMHeadLossContext.build_batches, loss_fn, forward",
        "xtuner/v1/model/base.py: L1263-1265 (the logged loss)",
    ),
)
RFC = Source(
    "InternLM/xtuner",
    "7b1246a3e3fcb156a6c579859061be78d8d520b7",
    (
        "xtuner/v1/loss/base_loss_ctx.py: L156, the all-reduce RFC #1335 drops",
        "xtuner/v1/engine/train_engine.py: L336-337",
    ),
)
PR1968 = Source(
    "InternLM/xtuner",
    "3ce8fea8d69a9d31f42aca3620ac7efd540ff3bd",
    (
        "xtuner/v1/loss/ce_loss.py: LMHeadLossContext.build_batches, forward, calibrate (PR #1968)",
        "xtuner/v1/model/base.py: FSDP gradient reduction SUM (PR #1968)",
    ),
)


@dataclass(frozen=True)
class Weights:
    per_micro_batch: list[torch.Tensor]  # each shard's token weights, already / (D + 1e-12)
    display_coeff: float  # PR #1968's calibrate(): D / this rank's weight sum


def build_batches(ctx, loss_reduction: str) -> Weights:
    """`LMHeadLossContext.build_batches` over this rank's micro-batches of the step (one all-reduce)."""
    weights = []
    for labels, whole in zip(ctx.labels, ctx.sequence_labels):
        if loss_reduction == "token":
            weight = torch.ones_like(labels, dtype=torch.float32)
        else:
            counts = (whole != ctx.ignore_index).sum(dim=1, keepdim=True).float()  # n_s of each row's whole sequence
            per_row = 1.0 / counts if loss_reduction == "sample" else 1.0 / torch.sqrt(counts)
            weight = per_row.expand(labels.shape).clone()  # inf for a row without targets: masked next
        weight[labels == ctx.ignore_index] = 0.0
        weights.append(weight)
    rank_denominator = sum(weight.sum() for weight in weights).to(ctx.device)
    global_denominator = rank_denominator.clone()
    dist.all_reduce(global_denominator, op=dist.ReduceOp.SUM, group=ctx.world_group)
    display_coeff = (global_denominator / rank_denominator.clamp_min(1e-12)).item()
    return Weights([weight / (global_denominator.cpu() + 1e-12) for weight in weights], display_coeff)


def loss_fn(logits, labels, ctx) -> torch.Tensor:
    """sum of token cross-entropy x weight: S_rsm / D for "token"."""
    logits = logits.float()
    if (labels != ctx.ignore_index).sum() == 0:
        return logits.sum() * 0
    weight = ctx.plan.per_micro_batch[ctx.micro_batch].to(logits.device)
    token_loss = F.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), reduction="none", ignore_index=ctx.ignore_index
    )
    return (token_loss * weight.flatten()).sum()


def _released(logits, labels, ctx):
    reduced = all_reduce(loss_fn(logits, labels, ctx), op=dist.ReduceOp.SUM, group=ctx.world_group)
    return reduced, reduced.detach()  # the engine then averages it over the ranks: L


@custom_rule(upstream=(RELEASED,), start_step=lambda ctx: build_batches(ctx, "token"), graph_all_reduce="torch_nn")
def released(logits, labels, ctx):
    """As released (loss_reduction="token"): S_rsm / N, all-reduced with a SUM backward over the world, FSDP mean."""
    return _released(logits, labels, ctx)


@custom_rule(upstream=(RELEASED,), start_step=lambda ctx: build_batches(ctx, "sample"), graph_all_reduce="torch_nn")
def sample(logits, labels, ctx):
    """As released with loss_reduction="sample": each row's token mean, rows averaged over the step."""
    return _released(logits, labels, ctx)


@custom_rule(upstream=(RELEASED,), start_step=lambda ctx: build_batches(ctx, "square"), graph_all_reduce="torch_nn")
def square(logits, labels, ctx):
    """As released with loss_reduction="square": token losses / sqrt(row count), / sum over rows of sqrt(count)."""
    return _released(logits, labels, ctx)


@custom_rule(upstream=(RELEASED, RFC), start_step=lambda ctx: build_batches(ctx, "token"))
def rfc_without_all_reduce(logits, labels, ctx):
    """RFC #1335: S_rsm / N backpropagated as it is, FSDP mean (grad L / W); the engine's mean logs L / W."""
    local = loss_fn(logits, labels, ctx)
    return local, local.detach()


@custom_rule(upstream=(PR1968,), start_step=lambda ctx: build_batches(ctx, "token"))
def pr1968(logits, labels, ctx):
    """PR #1968: S_rsm / N backpropagated as it is, FSDP SUM; each rank logs its own token mean (calibrate())."""
    local = loss_fn(logits, labels, ctx)
    return local, local.detach() * ctx.plan.display_coeff
