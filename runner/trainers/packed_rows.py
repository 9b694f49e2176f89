"""A token mean per packed row, the rows then averaged (unslothai/unsloth #1216, linkedin/Liger-Kernel #329).

With packing, one row holds several documents; a loss that takes each row's token mean and averages the
rows (then / M for accumulation, FSDP mean) weights a target by 1 / (rows x its row's count) instead of
1 / N: Liger #329's example, a target's weight 1/4 in one row against 1/9 over the step. Gradient:
(1/(W M B)) sum_rm sum_b dS_rmb / n_rmb, another direction whenever rows hold unequal counts. The fix is a
token mean over the step (`hf_trainer.loss`, num_items_in_batch over the step's rows and ranks).
"""

from __future__ import annotations

import torch.nn.functional as F

from runner.train.custom_rule import Source, custom_rule

BEFORE = Source(
    "unslothai/unsloth",
    "no commit pinned: unsloth #1216's pre-fix code was not found here, and Liger-Kernel #329 is a feature request "
    "(closed) whose example, not a diff, gives the weights",
    ("the fused cross-entropy's token mean per packed row (as reported in unsloth #1216 and Liger-Kernel #329)",),
)


@custom_rule(upstream=(BEFORE,))
def row_token_mean(logits, labels, ctx):
    """Each row's token mean (a row without targets adds 0), averaged over the micro-batch's rows, / M."""
    losses = F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=ctx.ignore_index, reduction="none"
    ).view(labels.shape)
    counts = (labels != ctx.ignore_index).sum(dim=1)
    row_means = losses.sum(dim=1) / counts.clamp(min=1)
    loss = row_means.mean() / ctx.grad_accum
    return loss, loss.detach()
