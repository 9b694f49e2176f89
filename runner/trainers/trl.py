"""TRL's GRPOTrainer `loss_type`s (grpo, bnpo, dr_grpo, dapo) under objective=pg.

A paraphrase: `GRPOTrainer._compute_loss` is a method of a whole trainer (model, generation, accelerate),
not callable alone. Read at huggingface/trl da5d8632bee3e386676702a785699bab862aabe4 (PR #6024's head,
"normalize dapo/cispo/vespo loss by the accumulation window token count"; trl 1.16.0 on the package
index has the same loss, with num_items_in_batch clamped at 1), trl/trainer/grpo_trainer.py:
- `_generate_and_score_completions`: num_items_in_batch = accelerator.gather(completion_mask.sum()).sum(),
  the completion tokens of the whole generation batch over all processes; the generation batch spans
  `steps_per_generation` micro-steps (default: gradient_accumulation_steps) and is split into them;
- `_compute_loss`, per micro-batch of B rows on a process (l_it = -A_i log p at ratio 1, mask = completion):
  grpo:    mean_i(sum_t l / clamp(n_i, 1)) / GA
  bnpo:    sum l / clamp(sum mask, 1) / GA
  dr_grpo: sum l / (B x max_completion_length) / GA
  dapo:    sum l / (num_items_in_batch / num_processes x GA / steps_per_generation)
- `loss_is_scaled_for_ga = True`: transformers' `training_step` divides no further; accelerate's DDP / FSDP
  averages the gradients over the processes.

Before PR #6024 (huggingface/trl at f2cd57710ae345ea6428ae95363267fcf38a3dc8, the same file) dapo's
normalizer had no GA / steps_per_generation factor: the accumulated loss is GA / steps_per_generation
times too large whenever the two differ (`dapo_spg1_before_6024`).

Here a process is a dp rank (its sp group, which computes the loss of the same whole sequences,
`runner.trainers.policy_gradient`; TRL itself has no sequence parallelism), GA = grad_accum and
max_completion_length = objective.max_response. After FSDP's mean (the mean over dp ranks), summed over
micro-batches: grpo is the mean of the responses' token means (B is the same on every process);
dr_grpo the sum over the step / (responses x max_completion_length); dapo (steps_per_generation = GA)
the global token mean; bnpo the mean of the micro-batches' token means; dapo with steps_per_generation = 1
the mean over micro-steps of each micro-step's global token mean.
"""

from __future__ import annotations

import torch

from runner.train.custom_rule import custom_rule
from runner.train.upstream import Source, Tested
from runner.trainers.policy_gradient import dp_sum, pg_token_losses

FILES = (
    "trl/trainer/grpo_trainer.py: GRPOTrainer._compute_loss (loss_type grpo, bnpo, dr_grpo, dapo)",
    "trl/trainer/grpo_trainer.py: GRPOTrainer._generate_and_score_completions (num_items_in_batch)",
    "trl/trainer/grpo_config.py: steps_per_generation (default gradient_accumulation_steps)",
)
TRL = Source("huggingface/trl", "da5d8632bee3e386676702a785699bab862aabe4", FILES)
BEFORE_6024 = Source("huggingface/trl", "f2cd57710ae345ea6428ae95363267fcf38a3dc8", FILES)
WINDOW_TEST = Tested(
    "upstream_tests",
    "tests/test_upstream_cases_trl.py::test_dapo_loss_normalized_per_accumulation_window",
    "huggingface/trl@da5d863 tests/test_grpo_trainer.py test_dapo_loss_normalized_per_accumulation_window: its "
    "cases and relation (the completions drawn here), the rule at steps_per_generation = GA",
)


def completion_losses(logits, labels, ctx) -> tuple[torch.Tensor, torch.Tensor]:
    """(per_token_loss, completion mask) of micro-batch m's whole sequences, [rows, seq]."""
    losses = pg_token_losses(logits, labels, ctx)
    mask = ctx.whole_labels.to(losses.device) != ctx.ignore_index
    return losses * mask, mask


def generation_tokens(ctx, steps_per_generation: int) -> list[float]:
    """num_items_in_batch of each micro-step's generation batch: the completion tokens of the
    `steps_per_generation` micro-steps it spans, over all processes (one all-reduce)."""
    per_micro_step = dp_sum([float(responses.length.sum()) for responses in ctx.responses], ctx)
    windows = [per_micro_step[m - m % steps_per_generation :][:steps_per_generation] for m in range(ctx.grad_accum)]
    return [sum(window) for window in windows]


def every_micro_step(ctx) -> list[float]:
    return generation_tokens(ctx, ctx.grad_accum)


def one_micro_step(ctx) -> list[float]:
    return generation_tokens(ctx, 1)


@custom_rule(upstream=(TRL,))
def grpo(logits, labels, ctx):
    """loss_type="grpo": each completion's token mean, their mean over the micro-batch, / GA."""
    losses, mask = completion_losses(logits, labels, ctx)
    return (losses.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / ctx.grad_accum


@custom_rule(upstream=(TRL,))
def bnpo(logits, labels, ctx):
    """loss_type="bnpo": the micro-batch's token mean on this process, / GA."""
    losses, mask = completion_losses(logits, labels, ctx)
    return losses.sum() / mask.sum().clamp(min=1.0) / ctx.grad_accum


@custom_rule(upstream=(TRL,))
def dr_grpo(logits, labels, ctx):
    """loss_type="dr_grpo": the micro-batch's sum / (its rows x max_completion_length), / GA."""
    losses, _ = completion_losses(logits, labels, ctx)
    return losses.sum() / (losses.size(0) * ctx.objective.max_response) / ctx.grad_accum


def _dapo(logits, labels, ctx, steps_per_generation: int, window_factor: bool) -> torch.Tensor:
    losses, _ = completion_losses(logits, labels, ctx)
    normalizer = max(ctx.plan[ctx.micro_batch], 1.0) / ctx.dp  # num_items_in_batch / num_processes
    if window_factor:  # PR #6024
        normalizer = normalizer * ctx.grad_accum / steps_per_generation
    return losses.sum() / normalizer


@custom_rule(upstream=(TRL, WINDOW_TEST), start_step=every_micro_step)
def dapo(logits, labels, ctx):
    """loss_type="dapo", steps_per_generation = GA (the default): sum / (num_items_in_batch / processes)."""
    return _dapo(logits, labels, ctx, ctx.grad_accum, window_factor=True)


@custom_rule(upstream=(TRL,), start_step=one_micro_step)
def dapo_spg1(logits, labels, ctx):
    """loss_type="dapo" with steps_per_generation=1: a generation batch per micro-step, each normalised by its
    own tokens x GA."""
    return _dapo(logits, labels, ctx, 1, window_factor=True)


@custom_rule(upstream=(BEFORE_6024,), start_step=one_micro_step)
def dapo_spg1_before_6024(logits, labels, ctx):
    """loss_type="dapo" with steps_per_generation=1 before PR #6024: no GA / steps_per_generation factor."""
    return _dapo(logits, labels, ctx, 1, window_factor=False)
