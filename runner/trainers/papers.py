"""The papers' own objectives, as references for the trainers' aggregation modes (objective=pg).

Each is a weight w_it on every response token's loss l_it = -A_i log p(o_it) over the whole step (B
responses, P = B / G prompts, N response tokens, |o_i| a response's length, T_g its group's tokens):

- GRPO (Shao et al. 2024, DeepSeekMath, its objective J_GRPO): (1/G) sum_i (1/|o_i|) sum_t, averaged over prompts:
  w = 1 / (B |o_i|): every response alike.
- DAPO (Yu et al. 2025, its objective J_DAPO, "token-level policy gradient loss"): 1 / (sum_i |o_i|) sum_i sum_t over a
  prompt's group, averaged over prompts: w = 1 / (P T_g): every prompt's group alike, its tokens alike.
- Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", its objective and its code): (1/G) sum_i sum_t,
  averaged over prompts, over a constant (the generation budget, objective.max_response):
  w = 1 / (B x max_response): every token alike.
- the plain token mean over the step, w = 1 / N, is the runner's own L under objective=pg: `reduction=sum`
  (trainer=reference) trains on it.

Each rank backpropagates sum over its shard of w l, counts from the whole step (DAPO's T_g with one
all-reduce of the groups' tokens over the dp ranks); FSDP sums (custom.fsdp_reduce=sum), so the
gradient is the objective's at every layout.
"""

from __future__ import annotations

import torch

from runner.train.custom_rule import custom_rule
from runner.train.upstream import Paper
from runner.trainers.policy_gradient import dp_sum, token_logps

GRPO = Paper("Shao et al. 2024, DeepSeekMath (GRPO)", "arXiv:2402.03300, the GRPO objective J_GRPO")
DAPO = Paper("Yu et al. 2025, DAPO", "arXiv:2503.14476, the DAPO objective J_DAPO (token-level policy gradient loss)")
DR_GRPO = Paper(
    "Liu et al. 2025, Understanding R1-Zero-Like Training (Dr. GRPO)",
    "arXiv:2503.20783, the Dr. GRPO objective (constant normaliser in its code)",
)


def shard_losses(logits, labels, ctx) -> torch.Tensor:
    """l_it = -A_i log p(o_it) on this shard's positions, [rows, cols]; 0 where there is no target."""
    logps = token_logps(logits, labels, ctx.ignore_index)
    return -ctx.micro_responses.advantage.to(logps.device)[:, None] * logps


def group_tokens(ctx) -> list[float]:
    """T_g of every prompt of the step: its responses' tokens, summed over the dp ranks (one all-reduce)."""
    groups = ctx.sequences // ctx.objective.group_size
    totals = [0.0] * groups
    for responses in ctx.responses:
        for group, length in zip(responses.group.tolist(), responses.length.tolist()):
            totals[group] += length
    return dp_sum(totals, ctx)


@custom_rule(upstream=(GRPO,))
def grpo(logits, labels, ctx):
    """w = 1 / (B |o_i|)."""
    lengths = ctx.micro_responses.length.to(logits.device).float()
    return (shard_losses(logits, labels, ctx).sum(-1) / lengths).sum() / ctx.sequences


@custom_rule(upstream=(DAPO,), start_step=group_tokens)
def dapo(logits, labels, ctx):
    """w = 1 / (P T_g)."""
    prompts = ctx.sequences // ctx.objective.group_size
    totals = torch.tensor(ctx.plan, dtype=torch.float32, device=logits.device)[ctx.micro_responses.group]
    return (shard_losses(logits, labels, ctx).sum(-1) / totals).sum() / prompts


@custom_rule(upstream=(DR_GRPO,))
def dr_grpo(logits, labels, ctx):
    """w = 1 / (B x max_response)."""
    return shard_losses(logits, labels, ctx).sum() / (ctx.sequences * ctx.objective.max_response)
