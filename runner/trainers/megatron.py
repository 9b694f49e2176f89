"""Megatron-LM's language-model loss and its data-parallel gradient reduction, both settings of
`calculate_per_token_loss`.

A paraphrase: megatron-core 0.19 needs Python >= 3.12 and its import needs triton, so it is not called
here. Read at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553:

- pretrain_gpt.py, `loss_func`: the per-token losses of every position times the loss mask, summed:
  `loss = sum(losses * loss_mask)`, with `num_tokens = loss_mask.sum()`, and the report
  `{'lm loss': [loss, num_tokens]}`.
- megatron/core/pipeline_parallel/schedules.py, `forward_step_calc_loss`: with
  calculate_per_token_loss=False the loss is divided by `clamp(num_tokens, min=1)` (this shard's own
  count) and by `num_microbatches`; with True it is backpropagated as it is, and
  `forward_backward_no_pipelining` sums num_tokens over the micro-batches for `finalize_model_grads`.
- megatron/core/distributed/distributed_data_parallel.py: the gradient scaling factor is 1/dp_cp_size
  before a SUM (a mean over dp x cp) by default, and 1.0 (a SUM) with calculate_per_token_loss.
- megatron/core/distributed/finalize_model_grads.py, `finalize_model_grads`: with a num_tokens, it is
  all-reduced over dp x cp and every gradient is scaled by 1 / clamp(num_tokens, min=1), after the
  backward and before clipping and the optimizer (this rule's `finish_gradients`).
- megatron/training/training.py, `train_step`: the logged loss is the report summed over
  micro-batches, all-reduced over dp x cp (one detached all-reduce of [loss sum, tokens]), divided:
  sum S / sum n = L (this rule's logged pair, carried in the runner's one logging all-reduce).

Here dp x cp is the runner's world (dp x sp, FSDP's group). Per step, with S_rsm, n_rsm the shard's
token-loss sum and count, N their global sum, M micro-batches:

- `per_token`: backpropagated S_rsm; FSDP SUM (custom.fsdp_reduce=sum); then x 1/N:
  sum_rsm dS_rsm / N = grad L at every layout. No collective on the loss: its own is the num_tokens
  all-reduce of finalize_model_grads, so its loss collectives per step equal torchtitan's.
- `default`: backpropagated S_rsm / max(n_rsm, 1) / M; FSDP mean (custom.fsdp_reduce=mean):
  (1/(W M)) sum_rsm dS_rsm / n_rsm, each shard's token mean weighted alike: another direction
  whenever shards hold unequal counts (an empty shard adds 0 and still counts in the mean).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from runner.train.custom_rule import custom_rule
from runner.train.upstream import Source

MEGATRON = Source(
    "NVIDIA/Megatron-LM",
    "d98e8a64ddf34856e74b24714e3bedb2f5a39553",
    (
        "pretrain_gpt.py: loss_func",
        "megatron/core/pipeline_parallel/schedules.py: forward_step_calc_loss, forward_backward_no_pipelining",
        "megatron/core/distributed/distributed_data_parallel.py: DistributedDataParallel (gradient scaling factor)",
        "megatron/core/distributed/finalize_model_grads.py: finalize_model_grads",
        "megatron/training/training.py: train_step (the logged loss)",
    ),
)


def masked_loss_sum(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`loss_func`: (sum of per-token losses x loss mask, num_tokens). Every position's loss is computed (an
    ignored target as class 0) and the mask zeroes it, as Megatron's loss mask does."""
    mask = labels != ignore_index
    losses = F.cross_entropy(logits.flatten(0, 1).float(), labels.masked_fill(~mask, 0).flatten(), reduction="none")
    return torch.sum(losses * mask.flatten().float()), mask.sum()


def finalize_model_grads(model: torch.nn.Module, ctx) -> None:
    """num_tokens (this rank's, over the step's micro-batches) all-reduced over dp x cp; gradients x 1/num_tokens."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    num_tokens = torch.tensor(ctx.rank_tokens, dtype=torch.int, device=ctx.device)
    dist.all_reduce(num_tokens, group=ctx.world_group)
    scaling = 1.0 / torch.clamp(num_tokens, min=1)
    torch._foreach_mul_([g.to_local() if isinstance(g, DTensor) else g for g in grads], scaling.item())


@custom_rule(upstream=(MEGATRON,), finish_gradients=finalize_model_grads)
def per_token(logits, labels, ctx):
    """calculate_per_token_loss=True: S_rsm backpropagated, FSDP SUM, gradients / N after the backward."""
    loss, num_tokens = masked_loss_sum(logits, labels, ctx.ignore_index)
    return loss, (loss.detach(), num_tokens)  # the report [loss sum, tokens]


@custom_rule(upstream=(MEGATRON,))
def default(logits, labels, ctx):
    """calculate_per_token_loss=False: S_rsm / max(n_rsm, 1) / M backpropagated, FSDP mean over dp x cp."""
    loss, num_tokens = masked_loss_sum(logits, labels, ctx.ignore_index)
    report = (loss.detach(), num_tokens)
    return loss / torch.clamp(num_tokens, min=1) / ctx.grad_accum, report


# NVIDIA/Megatron-LM PR #7513 (open: no merge commit; read from its description of 2026-09-19, "Fix
# context-parallel normalization of masked training losses"): "Reduce a cloned token count over the explicit CP
# group, normalize with the complete sequence's count, and compensate DDP's CP averaging", one scalar all-reduce
# per micro-batch. Its loss is S_rsm x cp / (n_rm M), with n_rm the micro-batch's whole sequences' count (the
# cp group's sum), under DDP's mean over dp x cp: (1/(dp M)) sum_dm dS_dm / n_dm, each dp rank's micro-batch
# mean weighted alike. grad L at dp = 1 and M = 1 (one count per step); another direction wherever the dp ranks'
# or the micro-batches' counts differ.
PR_7513 = Source(
    "NVIDIA/Megatron-LM",
    "PR #7513 (open, unmerged): its description",
    ("megatron/core/pipeline_parallel/schedules.py: forward_step_calc_loss, the cp-summed count and x cp",),
)


@custom_rule(upstream=(PR_7513,))
def pr_7513(logits, labels, ctx):
    """PR #7513's change: S_rsm / clamp(count all-reduced over cp, 1) x cp / M, FSDP mean over dp x cp."""
    loss, num_tokens = masked_loss_sum(logits, labels, ctx.ignore_index)
    sequence_tokens = num_tokens.detach().clone()
    dist.all_reduce(sequence_tokens, group=ctx.sp_group)  # the PR's one scalar all-reduce per micro-batch
    return loss / torch.clamp(sequence_tokens, min=1) * ctx.sp / ctx.grad_accum, (loss.detach(), num_tokens)
