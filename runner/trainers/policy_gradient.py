"""What the post-training rules (verl, trl, papers) share under objective=pg: each token's loss, whole
sequences across sp shards, the responses laid out as the trainers lay them out, and the step's counts.

The token loss is the policy-gradient surrogate at ratio 1: l_it = -A_i log p(o_it), A_i the response's
advantage (`runner.data.responses`; every trainer's clipped ratio is 1 when the policy is the one that
sampled, so min(ratio A, clip(ratio) A) = A and the gradient is -A grad log p).

Whole sequences: verl's Ulysses path computes the loss on whole sequences on every rank of an sp group
(`gather_outputs_and_unpad` gathers the log-probs over the group), and its `Gather` backward multiplies the
gradient by the group's size before keeping the rank's own slice. `whole_sequences` paraphrases that
(volcengine/verl at b178a3cd56f58b2d502255daba591e92833930a7, verl/utils/ulysses.py: Gather,
gather_outputs_and_unpad; verl 0.9.1's is the same): every sp rank of a dp rank then computes the same
loss of its whole sequences, and FSDP's mean over the W = dp x sp ranks leaves the mean over the dp ranks,
(1/W) sum_rs sp x d loss_r = (1/dp) sum_r d loss_r. TRL's GRPOTrainer has no sequence parallelism: its
rules are given whole sequences the same way, an sp group acting as one of its processes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def token_logps(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """log p(target) at every position of the shard, [rows, cols]; 0 where there is no target."""
    losses = F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=ignore_index, reduction="none"
    )
    return -losses.view(labels.shape)


class GatherSequence(torch.autograd.Function):
    """verl's ulysses `Gather` along the sequence: all-gather over the sp group forward; the gradient times the
    group's size, the rank's own slice, backward (no collective)."""

    @staticmethod
    def forward(ctx, group: dist.ProcessGroup, local: torch.Tensor) -> torch.Tensor:
        ctx.size, ctx.rank, ctx.width = dist.get_world_size(group), dist.get_rank(group), local.shape[1]
        parts = [torch.empty_like(local) for _ in range(ctx.size)]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        own = slice(ctx.rank * ctx.width, (ctx.rank + 1) * ctx.width)
        return None, (grad * ctx.size)[:, own].contiguous()


def whole_sequences(values: torch.Tensor, ctx) -> torch.Tensor:
    """The shard's [rows, cols] values as its rows' whole sequences [rows, cols x sp] (module docstring)."""
    return values if ctx.sp == 1 else GatherSequence.apply(ctx.sp_group, values)


def pg_token_losses(logits: torch.Tensor, labels: torch.Tensor, ctx) -> torch.Tensor:
    """l_it = -A_i log p(o_it) over micro-batch m's whole sequences, [rows, seq]; 0 where there is no target."""
    logps = whole_sequences(token_logps(logits, labels, ctx.ignore_index), ctx)
    advantage = ctx.micro_responses.advantage.to(logps.device)
    return -advantage[:, None] * logps


def response_matrix(values: torch.Tensor, responses, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values of each response's tokens, left-aligned and padded with 0 to `width`; the mask of its tokens),
    each [rows, width]: the (bs, response_length) matrices verl's and TRL's losses take."""
    position = torch.arange(width, device=values.device)
    columns = (responses.start.to(values.device)[:, None] + position).clamp(max=values.shape[1] - 1)
    mask = position < responses.length.to(values.device)[:, None]
    return torch.gather(values, 1, columns) * mask, mask


def longest_response(responses) -> int:
    """The longest response of these rows: the width verl pads a micro-batch's responses to."""
    return int(responses.length.max())


def dp_sum(values: list[float], ctx) -> list[float]:
    """The values summed over the dp ranks (one all-reduce; every sp rank of a dp rank holds the same)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor, group=ctx.dp_group)
    return tensor.tolist()
