"""objective=pg's data contract (runner/data/responses.py): each step's prompts, responses and advantages come
from (seed, step) alone, and every layout's ranks, micro-batches and sp chunks put back together are that
step's batch: the same tokens, targets, weights and advantages."""

from __future__ import annotations

import pytest
import torch
from helpers import run_config

from runner.data.batches import IGNORE_INDEX, RESPONSE_FIELDS, local_micro_batches
from runner.train.components import global_batches
from runner.train.reduction import token_loss_sum

OBJECTIVE = dict(objective__name="pg", objective__group_size=4, train__global_batch=16, seed=3)
LAYOUTS = [(1, 1, 1), (1, 1, 2), (2, 1, 1), (1, 2, 1), (2, 2, 2), (4, 1, 2), (2, 4, 1)]  # (dp, sp, grad_accum)


def batches(**overrides):
    return global_batches(run_config(**{**OBJECTIVE, **overrides}))


def test_rows_are_a_prompt_without_targets_then_a_response_with_its_advantage():
    cfg = run_config(**OBJECTIVE)
    batch = batches()(1)
    objective, r = cfg.objective, batch.responses
    valid = batch.labels != IGNORE_INDEX
    start = objective.prompt_len - 1
    for row in range(batch.labels.shape[0]):
        targets = valid[row].nonzero().flatten()
        assert targets.tolist() == list(range(start, start + int(r.length[row])))  # the response, contiguous
        assert (batch.weights[row, targets] == r.advantage[row]).all()
        assert (batch.weights[row][~valid[row]] == 0).all()
        prompt = batch.inputs[row, : objective.prompt_len]
        first = row - row % objective.group_size
        assert torch.equal(prompt, batch.inputs[first, : objective.prompt_len])  # a group shares its prompt
        assert torch.equal(batch.labels[row, targets], batch.inputs[row, targets + 1])  # shifted targets
    assert r.group.tolist() == [i // 4 for i in range(16)]
    assert int(r.length.min()) >= objective.min_response and int(r.length.max()) <= objective.max_response
    assert r.length.float().std() > 10  # lengths vary widely: long and short responses in one step


def test_advantages_are_each_groups_normalised_rewards_positive_and_negative():
    advantage = batches()(1).responses.advantage.view(-1, 4)
    assert (advantage > 0).any() and (advantage < 0).any()
    torch.testing.assert_close(advantage.mean(1), torch.zeros(4), atol=1e-6, rtol=0)
    torch.testing.assert_close(advantage.std(1), torch.ones(4), atol=1e-4, rtol=0)  # (r - mean) / (std + 1e-6)


def test_a_step_is_drawn_from_the_seed_and_the_step_alone():
    first, again = batches()(1), batches()(1)
    for a, b in ((first.inputs, again.inputs), (first.labels, again.labels), (first.weights, again.weights)):
        assert torch.equal(a, b)
    for name in RESPONSE_FIELDS:
        assert torch.equal(getattr(first.responses, name), getattr(again.responses, name))
    assert not torch.equal(first.responses.length, batches()(2).responses.length)
    assert not torch.equal(first.responses.advantage, batches(seed=4)(1).responses.advantage)


@pytest.mark.parametrize("dp, sp, grad_accum", LAYOUTS)
def test_every_layout_puts_back_the_same_tokens_and_advantages(dp, sp, grad_accum):
    batch = batches()(1)
    rows = [[None] * sp for _ in range(dp * grad_accum)]
    for r in range(dp):
        for s in range(sp):
            shares = local_micro_batches(batch, dp=dp, dp_rank=r, sp=sp, sp_rank=s, grad_accum=grad_accum)
            for m, micro in enumerate(shares):
                rows[r * grad_accum + m][s] = micro
    whole = {key: torch.cat([torch.cat([getattr(c, key) for c in chunks], 1) for chunks in rows]) for key in
             ("inputs", "labels", "weights")}  # fmt: skip
    for key, value in whole.items():
        assert torch.equal(value, getattr(batch, key)), key
    for name in RESPONSE_FIELDS:  # every sp chunk of a row carries the row's whole response
        per_chunk = [torch.cat([getattr(chunks[s].responses, name) for chunks in rows]) for s in range(sp)]
        for value in per_chunk:
            assert torch.equal(value, getattr(batch.responses, name)), name
    lengths = torch.cat([chunks[0].whole_labels for chunks in rows]).ne(IGNORE_INDEX).sum(1)
    assert torch.equal(lengths, batch.responses.length)  # |o_i| over all sp chunks


def test_the_runners_token_loss_is_minus_advantage_times_log_p():
    batch = batches()(1)
    logits = torch.randn(*batch.labels.shape, 256, dtype=torch.float64)
    log_p = torch.log_softmax(logits, -1).gather(-1, batch.labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    valid = batch.labels != IGNORE_INDEX
    want = (-batch.responses.advantage[:, None] * log_p)[valid].sum()
    assert float(token_loss_sum(logits, batch.labels, batch.weights)) == pytest.approx(float(want), rel=1e-5)
    assert float(token_loss_sum(logits, batch.labels)) == pytest.approx(float(-log_p[valid].sum()), rel=1e-5)
