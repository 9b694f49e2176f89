"""torchtitan's token-normalised cross-entropy, with FSDP's gradient division disabled.

Follows torchtitan:
- torchtitan/components/loss.py, `cross_entropy_loss` (sum reduction over the valid tokens) and
  `CrossEntropyLoss.__call__`: the sum divided by `global_valid_tokens`.
- torchtitan/trainer.py (the training step): `global_valid_tokens` is the step's count of valid labels
  over all its micro-batches, summed over the batch mesh (`dist_sum_tensor`): N (`ctx.global_tokens`).
- torchtitan/distributed/fsdp.py, `disable_fsdp_gradient_division`: FSDP's gradient divide factor 1.0,
  so the reduction is a SUM (custom.fsdp_reduce=sum).

Gradient: sum_rsm d(S_rsm / N) = grad L, with no per-micro-batch collective. torchtitan logs the global
loss sum over N, which is the runner's `loss` already, so this callable logs nothing of its own.
"""

from __future__ import annotations

import torch.nn.functional as F


def loss(logits, labels, ctx):
    """S_rsm / N, FSDP SUM."""
    summed = F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), reduction="sum", ignore_index=ctx.ignore_index
    )
    return summed / ctx.global_tokens
