"""The Hugging Face Trainer's causal-LM loss: its default, average_tokens_across_devices=False,
model_accepts_loss_kwargs=False, and its DeepSpeed-Ulysses sequence-parallel path.

Called: transformers' `ForCausalLMLoss` (transformers/loss/loss_utils.py), as the model's forward calls
it. The runner's labels are already shifted, so they go in as `shift_labels`.

Followed, from the installed transformers (its Trainer methods need a whole Trainer, and importing
`transformers.trainer` costs about 12 s a rank; tests/test_trainer_rules.py calls the installed
`Trainer._get_num_items_in_batch` and `Trainer.compute_loss` and checks them against these lines):
- trainer.py, `Trainer._get_num_items_in_batch`: `num_items_in_batch` counts the valid targets of the
  step's micro-batches (of the data loader's whole sequences); with `average_tokens_across_devices`
  (default True) gathered and summed over the processes; then divided (true division) by
  tp * cp * sp, the processes that see the same batch. The runner's sp shards play the context-parallel
  ranks: cp = sp, tp = 1, and DeepSpeed's sp = 1 on this path. None unless the model accepts loss kwargs.
- trainer.py, `Trainer.compute_loss`: with average_tokens_across_devices and a count, the loss is
  multiplied by `num_processes // tp_size` = W, because DDP and FSDP average the gradients.
- trainer.py, `Trainer.training_step`: a loss that was not normalised by `num_items_in_batch` is
  divided by the gradient-accumulation steps M. The logged loss is the backpropagated one, summed over
  micro-batches and averaged over the processes.
- integrations/deepspeed.py, `deepspeed_sp_compute_loss` (the Trainer's path when DeepSpeed-Ulysses
  sequence parallelism is on, which also sets `model_accepts_loss_kwargs=False`): each shard's token
  mean, weighted by its valid targets and summed over the SP group (a detached all-reduce), so its value
  is the micro-batch's token mean over whole sequences and its gradient each shard's own share; and,
  per its comment (and DeepSpeed PRs #4530, #5555 for ZeRO stages 0-2), DeepSpeed sums gradients over
  the SP group and averages over the data-parallel ranks: sp x FSDP's mean over W (`finish_gradients`).

Gradient under FSDP's mean over W = dp * sp (custom.fsdp_reduce=mean), with n_r the valid targets of dp
rank r's whole sequences over the step, n_rm of micro-batch m's:
- `loss`: (1/W) sum_rsm d(W S_rsm / N) = grad L.
- `loss_per_device`: each shard's S_rsm / (n_r / sp): (1/dp) sum_r dS_r / n_r, the dp ranks' token
  means averaged (grad L at dp = 1); 0/0, a NaN loss (zero gradient), where a dp rank has no target.
- `no_loss_kwargs`: the model's per-micro-batch shard mean / M: (1/(W M)) sum_rsm dS_rsm / n_rsm; NaN
  loss where a shard has no target.
- `deepspeed_ulysses`: (sp/W) sum_rsm dS_rsm / (n_rm M) = (1/(dp M)) sum_rm dS_rm / n_rm, the mean of
  micro-batch means (at sp = 1 the Trainer takes its default path: `loss`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers.loss.loss_utils import ForCausalLMLoss

from runner.train.custom_rule import custom_rule
from runner.train.upstream import Package, Tested

TRAINER = (
    "transformers/trainer.py: Trainer._get_num_items_in_batch",
    "transformers/trainer.py: Trainer.compute_loss",
    "transformers/trainer.py: Trainer.training_step",
)
TRANSFORMERS = Package("transformers", calls=("transformers.loss.loss_utils.ForCausalLMLoss",), follows=TRAINER)
ULYSSES = Package(
    "transformers",
    calls=("transformers.loss.loss_utils.ForCausalLMLoss",),
    follows=("transformers/integrations/deepspeed.py: deepspeed_sp_compute_loss", *TRAINER),
)
TP_SIZE = 1  # no tensor parallelism here
# The tests that hold these rules against the installed Trainer and transformers' own tests.
REAL_TRAINER = Tested(
    "release",
    "tests/test_hf_trainer_real.py::test_the_hf_trainer_rules_give_the_real_trainers_gradient_and_logged_loss",
    "the installed transformers.Trainer, one step under DDP on gloo (W=2, grad_accum=2, unequal counts): its "
    "gradient and logged loss",
)
INSTALLED_TRAINER_TEST = (
    "tests/test_trainer_upstream.py::test_the_hf_rules_count_and_scale_as_the_installed_trainer",
    "the installed transformers' Trainer._get_num_items_in_batch and Trainer.compute_loss on a stand-in Trainer: "
    "the count and the loss",
)
INSTALLED_TRAINER = Tested("release", *INSTALLED_TRAINER_TEST, via=("num_items_in_batch", "_trainer_loss"))
UPSTREAM_GA_TEST = (
    "tests/test_upstream_cases_hf.py::test_gradient_accumulation_loss_alignment_with_model_loss",
    "huggingface/transformers@0052c30 tests/trainer/test_trainer.py "
    "test_gradient_accumulation_loss_alignment_with_model_loss: its setting and claim (rows and logits drawn here)",
)


def num_items_in_batch(ctx, average_tokens_across_devices: bool) -> torch.Tensor:
    """`Trainer._get_num_items_in_batch` on this rank (the model accepts loss kwargs)."""
    count = sum((labels != ctx.ignore_index).sum() for labels in ctx.sequence_labels).to(ctx.device)
    if average_tokens_across_devices and ctx.world_size > 1:  # accelerator.gather(...).sum()
        gathered = [torch.zeros_like(count) for _ in range(ctx.world_size)]
        dist.all_gather(gathered, count, group=ctx.world_group)
        count = torch.stack(gathered).sum()
    cp_size, sp_size = ctx.sp, 1  # the runner's shards as context-parallel ranks; DeepSpeed's sp is its own path
    return count / (TP_SIZE * cp_size * sp_size)


def _model_loss(logits, labels, ctx, num_items=None) -> torch.Tensor:
    """What a *ForCausalLM's forward returns as its loss: ForCausalLMLoss, summed / num_items or the token mean."""
    return ForCausalLMLoss(
        logits,
        None,  # labels: unused when shift_labels is given
        vocab_size=logits.size(-1),
        num_items_in_batch=num_items,
        ignore_index=ctx.ignore_index,
        shift_labels=labels,
    )


def _trainer_loss(logits, labels, ctx, average_tokens_across_devices: bool, model_accepts_loss_kwargs: bool):
    num_items = ctx.plan if model_accepts_loss_kwargs else None
    loss = _model_loss(logits, labels, ctx, num_items)
    if average_tokens_across_devices and model_accepts_loss_kwargs and num_items is not None:
        loss = loss * (ctx.world_size // TP_SIZE)  # compute_loss: loss *= num_processes // tp_size
    if not (model_accepts_loss_kwargs and num_items is not None):
        loss = loss / ctx.grad_accum  # training_step: not scaled for gradient accumulation yet
    return loss, loss.detach()


@custom_rule(
    upstream=(
        TRANSFORMERS,
        REAL_TRAINER,
        INSTALLED_TRAINER,
        Tested("upstream_tests", *UPSTREAM_GA_TEST, via=("num_items_in_batch", "_trainer_loss")),
    ),
    start_step=lambda ctx: num_items_in_batch(ctx, True),
)
def loss(logits, labels, ctx):
    """The default Trainer (average_tokens_across_devices=True): W S / N, FSDP mean: grad L."""
    return _trainer_loss(logits, labels, ctx, True, True)


@custom_rule(
    upstream=(TRANSFORMERS, REAL_TRAINER, INSTALLED_TRAINER), start_step=lambda ctx: num_items_in_batch(ctx, False)
)
def loss_per_device(logits, labels, ctx):
    """average_tokens_across_devices=False: S_rsm / (n_r / sp), FSDP mean: the dp ranks' token means averaged."""
    return _trainer_loss(logits, labels, ctx, False, True)


@custom_rule(
    upstream=(
        TRANSFORMERS,
        REAL_TRAINER,  # the model's accepts_loss_kwargs set False
        Tested("release", *INSTALLED_TRAINER_TEST, via=("_trainer_loss",)),
        Tested(
            "release",
            "tests/test_release_parity.py::test_the_released_trainer_gives_the_arm_of_its_state",
            "transformers 4.48.0's and 4.48.1's own Trainer (from the package index), one step on a model without "
            "loss kwargs (W=1): gradient and logged loss",
            needs="the package index",
        ),
        Tested("upstream_tests", *UPSTREAM_GA_TEST, via=("_trainer_loss",)),
    )
)
def no_loss_kwargs(logits, labels, ctx):
    """model_accepts_loss_kwargs=False: the model's token mean of each micro-batch shard / M, FSDP mean."""
    return _trainer_loss(logits, labels, ctx, True, False)


def deepspeed_gradient_reduction(model: torch.nn.Module, ctx) -> None:
    """DeepSpeed sums gradients over the SP group and averages over dp: sp x FSDP's mean over W = dp * sp."""
    if ctx.sp > 1:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        torch._foreach_mul_([g.to_local() if isinstance(g, DTensor) else g for g in grads], float(ctx.sp))


def _ulysses_start(ctx):
    return num_items_in_batch(ctx, True) if ctx.sp == 1 else None


@custom_rule(upstream=(ULYSSES,), start_step=_ulysses_start, finish_gradients=deepspeed_gradient_reduction)
def deepspeed_ulysses(logits, labels, ctx):
    """`deepspeed_sp_compute_loss` / M: the micro-batch's token mean over the SP group, each shard backpropagating
    its own share; at sp = 1 the Trainer's default path."""
    if ctx.sp == 1:
        return _trainer_loss(logits, labels, ctx, True, True)
    loss = _model_loss(logits, labels, ctx)  # model_accepts_loss_kwargs=False: the shard's token mean
    good_tokens = (labels != ctx.ignore_index).sum()
    local_sum = torch.where(good_tokens > 0, loss.float(), 0.0) * good_tokens
    totals = torch.stack((local_sum.detach(), good_tokens.float()))
    dist.all_reduce(totals, group=ctx.sp_group)
    loss = (local_sum + (totals[0] - local_sum.detach())) / totals[1].clamp(min=1)
    loss = loss / ctx.grad_accum  # training_step: not scaled for gradient accumulation
    return loss, loss.detach()
