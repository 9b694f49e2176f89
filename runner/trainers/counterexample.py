"""A deliberately wrong combination, as a control of the trainers' side by side: what goes wrong when a
trainer keeps a SUM-backward all-reduce of its loss and also switches FSDP to a SUM.

Each rank backpropagates AR(S_rsm / N), the world's sum, through `ctx.all_reduce` (the configured
`autograd_all_reduce`; funcol and torch_nn all-reduce the gradient with SUM, so each rank's S_rsm / N
receives W); FSDP then sums over the W ranks instead of averaging (custom.fsdp_reduce=sum):
sum_rsm W d(S_rsm / N) = W x grad L. Either change alone is right (xtuner as released keeps the
all-reduce under FSDP's mean; its PR #1968 drops it under FSDP SUM); both together are W times too much.
It logs the all-reduced loss (L on every rank).
"""

from __future__ import annotations

from runner.train.custom_rule import CONFIGURED, custom_rule
from runner.train.reduction import token_loss_sum


@custom_rule(graph_all_reduce=CONFIGURED)
def sum_backward_under_fsdp_sum(logits, labels, ctx):
    """AR(S_rsm / N) with a SUM backward, under FSDP SUM: W x grad L."""
    reduced = ctx.all_reduce(token_loss_sum(logits, labels) / ctx.global_tokens)
    return reduced, reduced.detach()
