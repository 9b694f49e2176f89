"""xtuner v1's language-model cross-entropy, as released and as in its open PR #1968.

Released: xtuner/v1/loss/ce_loss.py, `LMHeadLossContext` (the deprecated alias `CELossContext`):
- `build_batches`: each valid target's weight is 1 ("token" reduction; 0 where the label is ignored),
  divided by the global denominator: the weights' sum over the step's micro-batches, all-reduced with
  SUM over the default (WORLD) group by an in-place `dist.all_reduce` (outside autograd). That is N,
  the step's global valid-token count (`ctx.global_tokens`, which the runner has all-reduced already).
- `loss_fn`: sum over tokens of cross-entropy x weight = S_rsm / N.
- `forward`: `all_reduce(loss, op=SUM, group=WORLD)` with `all_reduce` imported from
  `torch.distributed.nn.functional`: differentiable, and its backward all-reduces the gradient with
  SUM, so each rank's S_rsm / N receives W. FSDP2 keeps its default mean (custom.fsdp_reduce=mean):
  (1/W) * W * dL = grad L. The reduced forward value (the world's loss) is what it logs.

PR #1968 ("[FSDP][Loss] Reduce-sum gradient reduction with per-batch aux-loss hub", open): drops that
all-reduce and sets FSDP's gradient reduction to SUM (`set_gradient_divide_factor(1.0)` with
`set_force_sum_reduction_for_comms(True)`; custom.fsdp_reduce=sum): sum_rsm d(S_rsm / N) = grad L with
no per-micro-batch collective. Each rank then displays its own per-token mean loss (`calibrate()`,
no cross-rank all-reduce); the runner averages those over the ranks as `reported_loss`.
"""

from __future__ import annotations

import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.nn.functional import all_reduce  # as ce_loss.py imports it


def _weighted_sum(logits, labels, ctx):
    """`loss_fn`: sum of token cross-entropy x weight, the weights 1 / global denominator (0 where ignored)."""
    weight = (labels != ctx.ignore_index).float() / ctx.global_tokens
    token_loss = F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), reduction="none", ignore_index=ctx.ignore_index
    )
    return (token_loss * weight.flatten()).sum()


def loss(logits, labels, ctx):
    """xtuner v1 as released: S_rsm / N, differentiable all-reduce (SUM backward) over the world, FSDP mean."""
    reduced = all_reduce(_weighted_sum(logits, labels, ctx), op=dist.ReduceOp.SUM, group=ctx.world_group)
    return reduced, reduced.detach()


def loss_pr1968(logits, labels, ctx):
    """xtuner PR #1968: S_rsm / N backpropagated as it is, FSDP SUM; each rank logs its own token mean."""
    local = _weighted_sum(logits, labels, ctx)
    return local, local.detach() * ctx.global_tokens / max(ctx.rank_tokens, 1)
