"""torchtitan's token-normalised cross-entropy, through torchtitan 0.3.0's own code (the [trainers] extra).

Called here, from the installed package:
- torchtitan/distributed/utils.py, `dist_sum_tensor`: the step's global valid-token count, summed over
  the batch mesh (the dp ranks; context-parallel ranks load the same whole sequences), once per step
  before the first micro-batch, as `Trainer.train_step` does (this rule's `start_step`);
- torchtitan/components/loss.py, `CrossEntropyLoss.__call__(pred, labels, global_valid_tokens)`: the
  token cross-entropy summed (`cross_entropy_loss`, reduction="sum") and divided by that count.

Followed (not called):
- torchtitan/trainer.py, `Trainer.train_step`: the count is of the data loader's labels, i.e. this dp
  rank's whole sequences over the step's micro-batches (`ctx.sequence_labels`);
- torchtitan/distributed/fsdp.py, `disable_fsdp_gradient_division`: FSDP's divide factor 1.0, a SUM
  (custom.fsdp_reduce=sum). Called alone it asks gloo for PREMUL_SUM, which gloo lacks; the runner's
  `custom.fsdp_reduce=sum` sets the same factor with SUM-only comms (tests/test_trainer_rules.py
  checks that the two leave FSDP with the same divide factor).

Gradient: sum_rsm d(S_rsm / N) = grad L at every layout, with no per-micro-batch collective; its own
collective is the count's all-reduce. torchtitan logs sum over ranks of sum_m S_rsm / N, which is the
runner's `loss` already, so this rule logs nothing of its own.
"""

from __future__ import annotations

import functools

import torch
from torchtitan.components.loss import IGNORE_INDEX, CrossEntropyLoss
from torchtitan.distributed.utils import dist_sum_tensor

from runner.train.custom_rule import custom_rule
from runner.train.upstream import Package, Tested

TORCHTITAN = Package(
    "torchtitan",
    calls=("torchtitan.components.loss.CrossEntropyLoss", "torchtitan.distributed.utils.dist_sum_tensor"),
    follows=(
        "torchtitan/trainer.py: Trainer.train_step (global_valid_tokens of the step's labels)",
        "torchtitan/distributed/fsdp.py: disable_fsdp_gradient_division (custom.fsdp_reduce=sum)",
    ),
)


@functools.cache
def loss_function() -> CrossEntropyLoss:
    """torchtitan's default loss, built from its default config (no compile)."""
    return CrossEntropyLoss(CrossEntropyLoss.Config())


def global_valid_tokens(ctx) -> torch.Tensor:
    """`Trainer.train_step`: this rank's valid labels over the step, summed over the batch (dp) mesh."""
    local_valid_tokens = sum(int((labels != IGNORE_INDEX).sum()) for labels in ctx.sequence_labels)
    return dist_sum_tensor(torch.tensor(local_valid_tokens, dtype=torch.int64, device=ctx.device), ctx.dp_group)


DIVIDE_FACTOR = Tested(
    "release",
    "tests/test_trainer_upstream.py::test_torchtitans_divide_factor_is_the_one_fsdp_reduce_sum_sets",
    "the installed torchtitan's disable_fsdp_gradient_division: the FSDP divide factor custom.fsdp_reduce=sum sets",
)


@custom_rule(upstream=(TORCHTITAN, DIVIDE_FACTOR), start_step=global_valid_tokens)
def loss(logits, labels, ctx):
    """S_rsm / N by torchtitan's CrossEntropyLoss, N by its dist_sum_tensor; FSDP SUM."""
    scaled, _metrics = loss_function()(logits, labels, ctx.plan)
    return scaled
