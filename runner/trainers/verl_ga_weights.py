"""verl's token-mean loss on the cross-entropy objective under gradient accumulation, before and after verl #5625
(`bug=verl_sample_ratio_ga`; verl's post-training modes on objective=pg are `runner.trainers.verl`). A paraphrase:
`import verl` imports ray, so it is not installed here. Read at volcengine/verl, files as named in `BEFORE` /
`AFTER`.

- `sample_ratio_ga` (before the fix): each micro-batch's loss is `agg_loss(..., "token-mean")`, its masked sum
  over its own valid tokens, times the micro-batch's share of the mini-batch's samples (`loss_scale_factor`
  = micro-batch size / mini-batch size in dp_actor.py `update_policy`), FSDP mean over the dp ranks:
  (1/W) sum_rm (S_rm / n_rm)(B_rm / B_r) with B the rows: sum_i (sum_i / tokens_i)(samples_i / total)
  instead of sum sum_i / sum tokens_i; another direction whenever micro-batches hold unequal counts.
- `token_mean` (after): `agg_loss` with the step's global token count (all-reduced over dp by the caller)
  and dp_size: S_rm / N x dp, FSDP mean over W = dp: sum_rm dS_rm / N = grad L. At sp = 1 only: under
  sequence parallelism the count over dp is each shard's own (the case of verl #5983), not followed here.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from runner.train.custom_rule import custom_rule
from runner.train.upstream import Source

BEFORE = Source(
    "volcengine/verl",
    "b178a3cd56f58b2d502255daba591e92833930a7 (2026-01-29; verl #5625, filed 2026-03-16, reports this code)",
    (
        "verl/trainer/ppo/core_algos.py L1025, L1055-1058: agg_loss token-mean, batch_num_tokens = loss_mask.sum() "
        "(the micro-batch's own tokens) when none is given",
        "verl/workers/actor/dp_actor.py L575-578, L654-656: update_policy, loss_scale_factor = micro-batch size / "
        "ppo_mini_batch_size (or 1 / gradient_accumulation), loss = policy_loss * loss_scale_factor",
    ),
)
AFTER = Source(
    "volcengine/verl",
    "b178a3cd56f58b2d502255daba591e92833930a7 (the new engine's path; the legacy actor's fix, PR #5641, was closed "
    "unmerged: no fix commit to pin)",
    (
        "verl/trainer/ppo/core_algos.py L1055-1058: agg_loss token-mean, masked sum / batch_num_tokens x dp_size",
        "verl/workers/engine/fsdp/transformer_impl.py L489-493: batch_num_tokens all-reduced over the dp group",
    ),
)


def _masked_sum(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=ignore_index, reduction="sum"
    )


@custom_rule(upstream=(BEFORE,))
def sample_ratio_ga(logits, labels, ctx):
    """agg_loss token-mean of the micro-batch x its samples / the rank's samples of the step; FSDP mean."""
    tokens = int((labels != ctx.ignore_index).sum())
    token_mean = _masked_sum(logits, labels, ctx.ignore_index) / max(tokens, 1)
    samples = labels.shape[0]
    total = sum(micro.shape[0] for micro in ctx.labels)
    loss = token_mean * (samples / total)
    return loss, loss.detach()


def _global_tokens(ctx) -> torch.Tensor:
    """batch_num_tokens: this rank's valid targets of the step, all-reduced over dp."""
    count = torch.tensor(ctx.rank_tokens, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(count, group=ctx.dp_group)
    return count


@custom_rule(upstream=(AFTER,), start_step=_global_tokens)
def token_mean(logits, labels, ctx):
    """agg_loss token-mean with the global count: masked sum / batch_num_tokens x dp_size; FSDP mean."""
    loss = _masked_sum(logits, labels, ctx.ignore_index) / ctx.plan.item() * ctx.dp
    return loss, loss.detach()
