"""The Hugging Face Trainer's loss as it stood before two fixes, through the installed transformers' own
`ForCausalLMLoss` and the Trainer's lines of `runner.trainers.hf_trainer` with the fix taken out.

- `double_ga` (reported as axolotl #2262, LlamaFactory #7443): a model whose forward takes no `**kwargs`
  returns its own token mean per micro-batch, and the Trainer no longer divided it by M. As released,
  transformers 4.46.0 to 4.47.1 backpropagated that mean undivided (the Trainer leaves gradient
  accumulation to itself, not to accelerate), so the gradient is M x grad L; 4.47.1 also counted and
  passed `num_items_in_batch` for every model (PR #35121), so its logged loss is x M too (4.47.1
  trainer.py L5125-5147 `get_batch_samples`, L3687-3691 `training_step`), as was 4.46.0's and 4.46.1's
  (4.46.2 to 4.47.0 log it divided by M; tests/test_release_parity.py runs each release's Trainer against
  these arms). The rule is the test PR #35207
  added in 4.48.0 (divide by M only when `num_items_in_batch` is None, L3712-3713) with the count always
  passed: the state PR #35438 fixed in 4.48.1 by testing `model_accepts_loss_kwargs` instead
  (L3709-3710). Each shard backpropagates S_rsm / n_rsm, FSDP mean, so the gradient is
  (1/W) sum_rsm dS_rsm / n_rsm = M x grad L where every micro-batch holds as many targets, as 4.47.1's.
  The fix is `hf_trainer.no_loss_kwargs` (the model's mean / M).
- `ulysses_count` (reported in PR #46775, open): where accelerate shards each batch along the sequence for
  sequence parallelism at the data loader, `Trainer._get_num_items_in_batch` counts this process's shard,
  gathers over every process (N: each target counted once) and then divides by tp * cp * sp as though every
  sp rank had counted whole sequences: N / sp. `compute_loss` then scales the loss by the processes, and
  W S_rsm / (N / sp) under FSDP's mean gives sp x grad L: loss and gradient inflated by sp. No release is
  known to run this combination; the arm is the state the PR describes, with the division as installed.
  The fix (`hf_trainer.loss`) counts whole sequences, which every sp rank of a sequence sees.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from runner.train.custom_rule import custom_rule
from runner.train.upstream import Package, Source, Tested
from runner.trainers.hf_trainer import TP_SIZE, _model_loss, _trainer_loss, num_items_in_batch

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
PR_46775 = Source(
    "huggingface/transformers",
    "PR #46775 (open; the state its description reports, not a released one)",
    (
        "its description: accelerate shards the batch along the sequence for SP at the data loader, and "
        "`num_items_in_batch // non_data_parallel_size` divides a count of shards that was never multiplied",
        "the division as installed: transformers 5.25.0 src/transformers/trainer.py L2399-2402 (num_items_in_batch / "
        "(tp_size * cp_size * sp_size))",
    ),
)


def _counted_anyway(ctx) -> torch.Tensor:
    """num_items_in_batch as transformers 4.47.1 counted and passed it for every model (gathered over the processes)."""
    return num_items_in_batch(ctx, True)


RELEASES = Tested(
    "release",
    "tests/test_release_parity.py::test_the_released_trainer_gives_the_arm_of_its_state",
    "transformers 4.46.0's and 4.47.1's own Trainer (from the package index), one step on a model without loss "
    "kwargs (W=1): gradient and logged loss, and 4.47.0's gradient",
    needs="the package index",
)


@custom_rule(upstream=(TRANSFORMERS, BEFORE_35207, RELEASES), start_step=_counted_anyway)
def double_ga(logits, labels, ctx):
    """The model's own token mean of the shard (it takes no loss kwargs), not divided by M: num_items_in_batch
    was given, so training_step took the loss as normalised already."""
    loss = _model_loss(logits, labels, ctx)
    if ctx.plan is None:  # PR #35207's test: the count alone decides whether to divide by M
        loss = loss / ctx.grad_accum
    return loss, loss.detach()


def _count_of_sharded_batches(ctx) -> torch.Tensor:
    """`_get_num_items_in_batch` on batches sharded along the sequence: this shard's targets over the step,
    summed over all W processes (N), divided by tp * cp * sp as for whole sequences (N / sp)."""
    count = sum((labels != ctx.ignore_index).sum() for labels in ctx.labels).to(ctx.device)
    if ctx.world_size > 1:
        gathered = [torch.zeros_like(count) for _ in range(ctx.world_size)]
        dist.all_gather(gathered, count, group=ctx.world_group)
        count = torch.stack(gathered).sum()
    return count / (TP_SIZE * ctx.sp)


@custom_rule(upstream=(TRANSFORMERS, PR_46775), start_step=_count_of_sharded_batches)
def ulysses_count(logits, labels, ctx):
    """The default Trainer's loss, W S_rsm / num_items, with the count of the shards divided by sp (N / sp)."""
    return _trainer_loss(logits, labels, ctx, True, True)
