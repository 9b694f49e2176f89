"""TRL's test of PR #6024 (DAPO normalised by the accumulation window's tokens), its cases and expected
values fed to the project's TRL rules (runner/trainers/trl.py).

Upstream: huggingface/trl at da5d8632bee3e386676702a785699bab862aabe4 (PR #6024's head, the commit
runner/trainers/trl.py reads), tests/test_grpo_trainer.py,
TestGRPOTrainer::test_dapo_loss_normalized_per_accumulation_window. Its cases (steps_per_generation,
gradient_accumulation_steps, max_steps) are (4, 2, 2), (2, 2, 2), (2, 4, 1), with per_device_train_batch_size
3 and max_completion_length 8; at num_iterations=1, beta=0 the ratio coef_1 is 1, so each micro-step's loss
must be sum_i(-A_i x n_i) / (num_items_in_batch / num_processes x GA / steps_per_generation), num_items_in_batch
the completion tokens of the whole generation batch over all processes.

Upstream's inputs are a tiny model's generations; here each process's completion lengths (1..8) and
advantages are drawn from a seeded generator, and the relation is upstream's. The adapter: the rules'
per-token loss is -A_i log p (`runner.trainers.policy_gradient`), linear in log p; the test hands them
log p = 1 at every target (replacing `token_logps`), so their value is TRL's -A_i x coef_1 at coef_1 = 1, and
their gradient in log p is TRL's. Two gloo processes stand for accelerate's. The runner's rules cover
steps_per_generation = GA (`dapo`, called as registered, with its start_step) and 1 (`dapo_spg1`); the other
two cases call the same normaliser (`_dapo`) with the case's steps_per_generation, and the count from
`generation_tokens` (2, 4) or, where a generation batch spans two optimizer steps (4, 2), its tokens summed
over the processes with the rules' `dp_sum`.
"""

from __future__ import annotations

import pytest
import torch
from gloo_world import run_in_world

CASES = [(4, 2, 2), (2, 2, 2), (2, 4, 1)]  # (steps_per_generation, gradient_accumulation_steps, max_steps)
PROCESSES, ROWS, MAX_COMPLETION = 2, 3, 8


def completions(process: int, case: int, micro_steps: int):
    """Each micro-step's (lengths, advantages) of one process, [ROWS] each."""
    generator = torch.Generator().manual_seed(100 * case + process)
    lengths = torch.randint(1, MAX_COMPLETION + 1, (micro_steps, ROWS), generator=generator)
    return lengths, torch.randn(micro_steps, ROWS, generator=generator)


def in_world(cases) -> list:
    import torch.distributed as dist

    from runner.data.batches import IGNORE_INDEX, Responses
    from runner.train.custom_rule import LossContext, StepContext
    from runner.trainers import policy_gradient
    from runner.trainers import trl as rules

    rank, logps = dist.get_rank(), {}

    def ones(logits, labels, ignore_index):  # log p = 1: the loss's value is TRL's at coef_1 = 1
        logps["leaf"] = torch.ones(labels.shape, dtype=torch.float64, requires_grad=True)
        return logps["leaf"]

    policy_gradient.token_logps = ones
    records = []
    for case, (spg, ga, max_steps) in enumerate(cases):
        lengths, advantages = completions(rank, case, max_steps * ga)
        every = [completions(p, case, max_steps * ga)[0] for p in range(PROCESSES)]
        for step in range(max_steps):
            micro = range(step * ga, (step + 1) * ga)
            responses = tuple(
                Responses(
                    sequence=torch.arange(ROWS),
                    group=torch.zeros(ROWS, dtype=torch.int64),
                    advantage=advantages[m],
                    length=lengths[m],
                    start=torch.zeros(ROWS, dtype=torch.int64),
                )
                for m in micro
            )
            labels = tuple(
                torch.where(torch.arange(MAX_COMPLETION)[None, :] < lengths[m][:, None], 0, IGNORE_INDEX) for m in micro
            )
            world = dist.group.WORLD
            ctx = StepContext(
                world_size=PROCESSES, dp=PROCESSES, sp=1, rank=rank, dp_rank=rank, sp_rank=0, grad_accum=ga,
                global_tokens=0, rank_tokens=0, rank_sequence_tokens=0, labels=labels, sequence_labels=labels,
                world_group=world, dp_group=world, sp_group=world, device=torch.device("cpu"),
                responses=responses,
            )  # fmt: skip
            if spg == ga:  # the default: the registered rule's own start_step
                plan = rules.dapo.start_step(ctx)
            elif ga % spg == 0:  # the generation batches lie within the step: the rules' own count
                plan = rules.generation_tokens(ctx, spg)
            else:  # a generation batch spans optimizer steps (spg > GA): its tokens, over the processes
                first = (micro[0] // spg) * spg
                (tokens,) = rules.dp_sum([float(lengths[first : first + spg].sum())], ctx)
                plan = [tokens] * ga
            for i, m in enumerate(micro):
                first = (m // spg) * spg
                num_items = float(sum(int(p[first : first + spg].sum()) for p in every))  # upstream's count
                window = num_items / PROCESSES * ga / spg
                expected = (-advantages[m] * lengths[m]).sum() / window
                got = {}
                for factor in (True, False):
                    lctx = LossContext(
                        **{f: getattr(ctx, f) for f in ctx.__dataclass_fields__ if f != "plan"},
                        plan=plan, micro_batch=i, shard_tokens=0, sequence_tokens=0,
                    )  # fmt: skip
                    logits = torch.zeros(ROWS, MAX_COMPLETION, 2)
                    if factor and spg == ga:  # the registered rule `dapo` itself
                        loss = rules.dapo(logits, labels[i], lctx)
                    else:
                        loss = rules._dapo(logits, labels[i], lctx, spg, window_factor=factor)
                    loss.backward()
                    got[factor] = (loss.detach(), logps["leaf"].grad)
                mask = labels[i] != IGNORE_INDEX
                expected_grad = (-advantages[m][:, None] / window).double() * mask
                records.append((case, m, plan[i], num_items, expected, got, expected_grad))
    return records


@pytest.fixture(scope="module")
def records():
    return run_in_world(in_world, PROCESSES, CASES)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"spg{s}-ga{g}-steps{n}" for s, g, n in CASES])
def test_dapo_loss_normalized_per_accumulation_window(records, case):
    """UPSTREAM test_dapo_loss_normalized_per_accumulation_window: every micro-step's loss (and gradient in
    log p) is the window-normalised one; before PR #6024 (no GA / steps_per_generation factor) it was
    GA / steps_per_generation times it, the same only where the two are equal."""
    spg, ga, max_steps = CASES[case]
    for rank_records in records:
        mine = [r for r in rank_records if r[0] == case]
        assert len(mine) == max_steps * ga  # upstream: len(captured) == max_steps * gradient_accumulation_steps
        for _, m, plan, num_items, expected, got, expected_grad in mine:
            assert plan == num_items  # num_items_in_batch: the generation batch's tokens over the processes
            loss, grad = got[True]
            torch.testing.assert_close(loss, expected.double(), rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(grad, expected_grad, rtol=1e-6, atol=1e-9)
            before, _ = got[False]
            torch.testing.assert_close(before, expected.double() * ga / spg, rtol=1e-6, atol=1e-9)
            assert (spg == ga) == bool(torch.isclose(before, loss)), f"micro-step {m}"
