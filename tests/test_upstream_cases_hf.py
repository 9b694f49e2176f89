"""transformers' test of `num_items_in_batch` under gradient accumulation, its setting and its claim carried to
the project's Hugging Face Trainer rules (runner/trainers/hf_trainer.py).

Upstream: huggingface/transformers at 0052c30e2198e6d9f60c8517df6502042fd48345, tests/trainer/test_trainer.py,
TrainerIntegrationPrerunTest::test_gradient_accumulation_loss_alignment_with_model_loss (and
..._with_loss_func, the same with a compute_loss_func). Its inputs are a Hub model (nickypro/tinyllama-15M) and
wikitext-2 rows padded to 16 tokens, trained 5 steps: not reachable here, and its bounds (a difference under
0.01 with num_items_in_batch, over 0.7 without) belong to those. What carries over is the setting, batch 8 in
one micro-batch against gradient_accumulation_steps 2 x per_device_train_batch_size 4, rows of 16 positions
with their padding masked (-100), and the claim: with num_items_in_batch the accumulated loss is the
whole batch's; with model_accepts_loss_kwargs=False (the "broken" arm) it is the mean of the micro-batches'
means, which differs. The rows' lengths and the logits are drawn here; the logits stand for the model's
output (the loss is a function of them), and the labels are already shifted, as the runner hands them over.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from runner.trainers import hf_trainer

ROWS, POSITIONS, VOCAB = 8, 16, 50


def batch():
    generator = torch.Generator().manual_seed(42)
    logits = torch.randn(ROWS, POSITIONS, VOCAB, generator=generator)
    labels = torch.randint(0, VOCAB, (ROWS, POSITIONS), generator=generator)
    lengths = torch.tensor([16, 3, 9, 16, 5, 12, 2, 7])  # padding="max_length": each row's real tokens
    labels[torch.arange(POSITIONS)[None, :] >= lengths[:, None]] = -100
    return logits, labels


def step_loss(logits, labels, grad_accum: int, accepts: bool) -> torch.Tensor:
    """The step's loss as the rules backpropagate it, summed over its micro-batches (one process)."""
    rows = ROWS // grad_accum
    micro = [(logits[i : i + rows], labels[i : i + rows]) for i in range(0, ROWS, rows)]
    ctx = SimpleNamespace(
        sequence_labels=tuple(m[1] for m in micro), ignore_index=-100, world_size=1, sp=1,
        device=torch.device("cpu"), grad_accum=grad_accum,
    )  # fmt: skip
    ctx.plan = hf_trainer.num_items_in_batch(ctx, True) if accepts else None  # Trainer._get_num_items_in_batch
    return sum(hf_trainer._trainer_loss(lg, lb, ctx, True, accepts)[0] for lg, lb in micro)


def test_gradient_accumulation_loss_alignment_with_model_loss():
    """UPSTREAM test_gradient_accumulation_loss_alignment_with_model_loss: base (batch 8) and grad-accum
    (2 x 4) agree with num_items_in_batch; the broken arm (model_accepts_loss_kwargs=False) does not."""
    logits, labels = batch()
    base = step_loss(logits, labels, grad_accum=1, accepts=True)
    grad_accum = step_loss(logits, labels, grad_accum=2, accepts=True)
    broken = step_loss(logits, labels, grad_accum=2, accepts=False)
    tokens = int((labels != -100).sum())
    assert tokens == 70
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / tokens
    torch.testing.assert_close(base, expected)  # the whole batch's token mean
    torch.testing.assert_close(grad_accum, base)  # upstream: max(diff_truth) < 0.01
    # the broken arm: each micro-batch's own mean, / GA (the first 4 rows hold 44 tokens, the last 26)
    first = torch.nn.functional.cross_entropy(logits[:4].flatten(0, 1), labels[:4].flatten())
    last = torch.nn.functional.cross_entropy(logits[4:].flatten(0, 1), labels[4:].flatten())
    torch.testing.assert_close(broken, (first + last) / 2)
    assert abs(float(broken - base)) > 1e-3  # upstream: max(diff_broken) > 0.7 on its model and data


@pytest.mark.parametrize("accepts", [True, False])
def test_gradient_accumulation_without_padding_agrees_either_way(accepts):
    """Ours, a control for the above: the same setting with every row whole (no -100): the micro-batches hold equal counts, so the broken
    arm's mean of means is the token mean too; upstream's difference comes from the padding alone."""
    logits, labels = batch()
    labels = torch.randint(0, VOCAB, labels.shape, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        step_loss(logits, labels, grad_accum=2, accepts=accepts), step_loss(logits, labels, 1, True)
    )
