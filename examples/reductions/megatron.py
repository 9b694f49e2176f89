"""Megatron-LM's per-token loss (`calculate_per_token_loss=True`), reduced with Megatron's identity-backward rule.

Follows Megatron-LM:
- pretrain_gpt.py, `loss_func`: the loss is the masked token sum `sum(losses * loss_mask)`, not averaged,
  returned with `num_tokens = loss_mask.sum()`.
- megatron/core/pipeline_parallel/schedules.py, `forward_step_calc_loss`: with calculate_per_token_loss
  that sum is backpropagated as it is (no division by num_tokens or by the micro-batch count).
- megatron/core/distributed/distributed_data_parallel.py: with calculate_per_token_loss the gradient
  scaling factor is 1.0: the data-parallel gradient reduction is a SUM (custom.fsdp_reduce=sum).
- megatron/core/distributed/finalize_model_grads.py, `finalize_model_grads`: num_tokens is all-reduced
  over the dp x cp ranks and every gradient is scaled by 1 / num_tokens: sum_rsm dS_rsm / N = grad L.
- megatron/core/tensor_parallel/mappings.py, `_ReduceFromModelParallelRegion`: how Megatron reduces a
  value out of a parallel region: all-reduce in the forward, the gradient passed through unchanged in
  the backward.

Here N is known when the step starts (the runner all-reduces it before the first micro-batch), so the
loss is divided by N, which gives the gradient that Megatron's 1 / num_tokens after the backward
gives. The per-token sum is reduced over the world with `_ReduceFromModelParallelRegion`'s rule (which
Megatron applies inside its model-parallel regions, not to this loss): its forward value is the world's
sum, so the value logged is L, and its backward leaves each rank's gradient as it was. A collective
with an identity backward changes nothing in the gradient, which FSDP's SUM then makes grad L.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


class _ReduceFromRegion(torch.autograd.Function):
    """All-reduce (SUM) forward; the gradient passes through unchanged backward."""

    @staticmethod
    def forward(ctx, tensor, group):
        reduced = tensor.clone()
        dist.all_reduce(reduced, group=group)
        return reduced

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


def loss(logits, labels, ctx):
    """Per-token sum S_rsm, reduced with an identity backward, / N; FSDP SUM."""
    token_sum = F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), reduction="sum", ignore_index=ctx.ignore_index
    )
    reduced = _ReduceFromRegion.apply(token_sum, ctx.world_group) / ctx.global_tokens
    return reduced, reduced.detach()  # the world's loss of micro-batch m, on every rank: summed over m, it is L
