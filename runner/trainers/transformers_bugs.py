"""The Hugging Face Trainer's loss as it stood before two fixes, through the installed transformers' own
`ForCausalLMLoss` and the Trainer's lines of `runner.trainers.hf_trainer` with the fix taken out.

- `double_ga` (huggingface/transformers before PR #35207; reported as axolotl #2262, LlamaFactory #7443):
  `Trainer.training_step` divided the loss by the gradient-accumulation steps only when
  `num_items_in_batch` was None. The Trainer counted and passed it whatever the model did with it, so a
  model that does not accept loss kwargs returned its own token mean per micro-batch and that mean was
  never divided by M: each shard backpropagates S_rsm / n_rsm, FSDP mean, so the gradient is
  (1/W) sum_rsm dS_rsm / n_rsm = M x grad L where every micro-batch holds as many targets. The fix
  (`hf_trainer.no_loss_kwargs`) tests `model_accepts_loss_kwargs` too and divides by M.
- `ulysses_count` (before PR #46775): `Trainer._get_num_items_in_batch` gathered the count over every
  process and did not divide it by tp * cp * sp, though the sp ranks of a sequence all count it: the
  count is sp x N, and W S_rsm / (sp N) under FSDP's mean gives grad L / sp. The fix (`hf_trainer.loss`)
  divides by the processes that see the same batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from runner.train.custom_rule import Package, Source, custom_rule
from runner.trainers.hf_trainer import _model_loss, _trainer_loss, num_items_in_batch

TRANSFORMERS = Package("transformers", calls=("transformers.loss.loss_utils.ForCausalLMLoss",))
# The pre-fix commits are not pinned: the repository's history was not available to this project (its snapshot
# is too large to fetch). What is pinned is where the fix stands in the installed release (transformers 5.25.0):
# the rule takes those lines out.
BEFORE_35207 = Source(
    "huggingface/transformers",
    "the parent of PR #35207's merge (commit not pinned here)",
    (
        "src/transformers/trainer.py: Trainer.training_step (the division by gradient_accumulation_steps when "
        "num_items_in_batch is None)",
        "the fix as installed: transformers 5.25.0 src/transformers/trainer.py L2147-2155 (loss_is_scaled_for_ga "
        "needs model_accepts_loss_kwargs as well as num_items_in_batch)",
    ),
)
BEFORE_46775 = Source(
    "huggingface/transformers",
    "the parent of PR #46775's merge (commit not pinned here)",
    (
        "src/transformers/trainer.py: Trainer._get_num_items_in_batch (no division by the non-data-parallel size)",
        "the fix as installed: transformers 5.25.0 src/transformers/trainer.py L2399-2402 (num_items_in_batch / "
        "(tp_size * cp_size * sp_size))",
    ),
)


def _counted_anyway(ctx) -> torch.Tensor:
    """num_items_in_batch as the Trainer counted and passed it before PR #35207 (gathered over the processes)."""
    return num_items_in_batch(ctx, True)


@custom_rule(upstream=(TRANSFORMERS, BEFORE_35207), start_step=_counted_anyway)
def double_ga(logits, labels, ctx):
    """The model's own token mean of the shard (it takes no loss kwargs), not divided by M: num_items_in_batch
    was given, so training_step took the loss as normalised already."""
    loss = _model_loss(logits, labels, ctx)
    if ctx.plan is None:  # the pre-fix test: the count alone decided whether to divide by M
        loss = loss / ctx.grad_accum
    return loss, loss.detach()


def _count_over_every_process(ctx) -> torch.Tensor:
    """`_get_num_items_in_batch` before PR #46775: this rank's whole sequences' targets, summed over all W."""
    count = sum((labels != ctx.ignore_index).sum() for labels in ctx.sequence_labels).to(ctx.device)
    if ctx.world_size > 1:
        gathered = [torch.zeros_like(count) for _ in range(ctx.world_size)]
        dist.all_gather(gathered, count, group=ctx.world_group)
        count = torch.stack(gathered).sum()
    return count


@custom_rule(upstream=(TRANSFORMERS, BEFORE_46775), start_step=_count_over_every_process)
def ulysses_count(logits, labels, ctx):
    """The default Trainer's loss, W S_rsm / num_items, with the count of every process (sp x N under SP)."""
    return _trainer_loss(logits, labels, ctx, True, True)
