"""The Hugging Face Trainer's loss as it stood before two fixes, through the installed transformers' own
`ForCausalLMLoss` and the Trainer's lines of `runner.trainers.hf_trainer` with the fix taken out.

- `double_ga` (reported as axolotl #2262, LlamaFactory #7443): a model whose forward takes no `**kwargs`
  returns its own token mean per micro-batch, and the Trainer no longer divided it by M. As released,
  transformers 4.46.0 to 4.47.1 backpropagated that mean undivided (the Trainer leaves gradient
  accumulation to itself, not to accelerate), so the gradient is M x grad L; 4.47.1 also counted and
  passed `num_items_in_batch` for every model (PR #35121), so its logged loss is x M too (4.47.1
  trainer.py L5125-5147 `get_batch_samples`, L3687-3691 `training_step`). The rule is the test PR #35207
  added in 4.48.0 (divide by M only when `num_items_in_batch` is None, L3712-3713) with the count always
  passed: the state PR #35438 fixed in 4.48.1 by testing `model_accepts_loss_kwargs` instead
  (L3709-3710). Each shard backpropagates S_rsm / n_rsm, FSDP mean, so the gradient is
  (1/W) sum_rsm dS_rsm / n_rsm = M x grad L where every micro-batch holds as many targets, as 4.47.1's.
  The fix is `hf_trainer.no_loss_kwargs` (the model's mean / M).
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
# Pinned by release: the wheels on the package index hold each state (line numbers of their trainer.py).
BEFORE_35207 = Source(
    "huggingface/transformers",
    "release 4.47.1 (on the package index); the rule's test is PR #35207's, fixed by PR #35438 in 4.48.1",
    (
        "4.47.1 src/transformers/trainer.py L5125-5147 (get_batch_samples counts num_items_in_batch for every "
        "model) and L3687-3691 (training_step: backward with no division by gradient_accumulation_steps)",
        "4.48.0 src/transformers/trainer.py L3712-3713 (divide by gradient_accumulation_steps when "
        "num_items_in_batch is None); 4.48.1 L3709-3710 (when the model takes no loss kwargs)",
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
    """num_items_in_batch as transformers 4.47.1 counted and passed it for every model (gathered over the processes)."""
    return num_items_in_batch(ctx, True)


@custom_rule(upstream=(TRANSFORMERS, BEFORE_35207), start_step=_counted_anyway)
def double_ga(logits, labels, ctx):
    """The model's own token mean of the shard (it takes no loss kwargs), not divided by M: num_items_in_batch
    was given, so training_step took the loss as normalised already."""
    loss = _model_loss(logits, labels, ctx)
    if ctx.plan is None:  # PR #35207's test: the count alone decides whether to divide by M
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
