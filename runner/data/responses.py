"""objective=pg: each step's global batch as prompts and responses with advantages, a policy-gradient step.

The data contract is `runner.data.batches`': everything below is drawn from (seed, step) alone, never from
the world size, sp or grad_accum, and split over dp ranks, micro-batches and sp chunks as any batch is
(`local_micro_batches`), so every layout trains on the same tokens with the same advantages.

Row i of a step's `train.global_batch` rows is response j = i % G of prompt g = i // G (G =
`objective.group_size`; a group's rows are consecutive, so the split over ranks may cut a group). Its
sequence is the prompt (`objective.prompt_len` tokens, the same for the G responses of a prompt), then its
response of |o_i| tokens, |o_i| drawn uniformly from [min_response, max_response], then padding. Only the
response's tokens are targets: label t (the target of position t, token t + 1) is valid for t in
[prompt_len - 1, prompt_len - 1 + |o_i|). Tokens are windows of the corpus (its documents joined by the
packing separator), the prompt's and each response's drawn apart.

Each response draws a reward r_i ~ U(0, 1), and its advantage is GRPO's outcome advantage within its
group, A_i = (r_i - mean_g r) / (std_g r + 1e-6) (std with Bessel's correction, as verl's
`compute_grpo_outcome_advantage` and TRL's GRPOTrainer compute it; A_i = r_i - 1/2 for G = 1): positive
and negative, mean 0 in each group.

The token loss is -A_i log p(target) = A_i x CE(target), the policy-gradient surrogate at ratio 1: the
runner's own modes take A_i as each target's weight (`Batch.weights`), so their L is the token mean of it
over the step; a custom rule gets each row's advantage, group, length and first target (`Responses`)
through its context (`runner.train.custom_rule`).
"""

from __future__ import annotations

import numpy as np
import torch

from runner.config import ObjectiveConfig
from runner.data.batches import BYTE_SEPARATOR, IGNORE_INDEX, PAD_TOKEN, Batch, Responses

EPSILON = 1e-6  # verl's and TRL's epsilon in the advantage's denominator


def group_advantages(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """A_i = (r_i - mean of its group) / (std of its group + 1e-6), rows in groups of `group_size`."""
    grouped = rewards.reshape(-1, group_size)
    if group_size == 1:
        return (grouped - 0.5).reshape(-1)
    mean = grouped.mean(axis=1, keepdims=True)
    std = grouped.std(axis=1, ddof=1, keepdims=True)
    return ((grouped - mean) / (std + EPSILON)).reshape(-1)


class ResponseBatches:
    """The global batch of each step under objective=pg (module docstring), as `GlobalBatches` for ce."""

    def __init__(
        self,
        documents: list[torch.Tensor],
        objective: ObjectiveConfig,
        *,
        seq_len: int,
        global_batch: int,
        seed: int,
        separator: torch.Tensor = BYTE_SEPARATOR,
    ):
        if objective.prompt_len + objective.max_response > seq_len:
            raise ValueError(
                f"objective.prompt_len ({objective.prompt_len}) + objective.max_response ({objective.max_response}) "
                f"must be at most train.seq_len ({seq_len})"
            )
        self.objective = objective
        self.seq_len, self.global_batch, self.seed = seq_len, global_batch, seed
        separator = separator.to(documents[0].dtype)
        self.stream = torch.cat([piece for doc in documents for piece in (doc, separator)]).long()

    def _window(self, rng: np.random.Generator, length: int) -> torch.Tensor:
        start = int(rng.integers(self.stream.numel() - length + 1))
        return self.stream[start : start + length]

    def __call__(self, step: int) -> Batch:
        """The global batch of optimizer step `step` (1-based)."""
        objective, rows = self.objective, self.global_batch
        rng = np.random.default_rng([self.seed, step])
        lengths = rng.integers(objective.min_response, objective.max_response + 1, size=rows)
        rewards = rng.random(rows)
        advantages = torch.tensor(group_advantages(rewards, objective.group_size), dtype=torch.float32)
        inputs = torch.full((rows, self.seq_len), PAD_TOKEN, dtype=torch.long)
        labels = torch.full((rows, self.seq_len), IGNORE_INDEX, dtype=torch.long)
        weights = torch.zeros((rows, self.seq_len), dtype=torch.float32)
        prompt_len, start = objective.prompt_len, objective.prompt_len - 1
        prompt = None
        for row in range(rows):
            if row % objective.group_size == 0:
                prompt = self._window(rng, prompt_len)
            response = self._window(rng, int(lengths[row]))
            tokens = torch.cat([prompt, response])  # prompt_len + |o_i| <= seq_len: every target has its input
            inputs[row, : tokens.numel()] = tokens
            end = start + response.numel()
            labels[row, start:end] = response
            weights[row, start:end] = advantages[row]
        responses = Responses(
            sequence=torch.arange(rows),
            group=torch.arange(rows) // objective.group_size,
            advantage=advantages,
            length=torch.as_tensor(lengths, dtype=torch.long),
            start=torch.full((rows,), start, dtype=torch.long),
        )
        return Batch(inputs, labels, weights=weights, responses=responses)
