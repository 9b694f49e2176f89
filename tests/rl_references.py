"""Single-process references of the post-training rules (objective=pg): each formula written out here.

Nothing here imports runner.trainers. From step 1's global batch the unsharded model gives every
target's log p; l[i, t] = -A_i log p (0 where there is no target). A layout cuts the rows into dp ranks,
then micro-batches (`Step.rows`), and the columns into sp chunks (`Step.cols`).

The trainers compute each micro-batch's loss on whole sequences on every sp rank, and FSDP's mean over
W = dp x sp leaves the mean over dp ranks: their objective is J = (1/dp) sum_r sum_m f(rows of r, m),
with f the trainer's formula for one micro-batch (`per_micro_batch`). verl's CP count is the exception:
each sp rank divides by its own chunk's count and keeps its own slice's gradient,
J = sum_s (sum of chunk s's l) / N_s. The papers' objectives are weights over the whole step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

IGNORE = -100


@dataclass
class Step:
    """One step's token losses and responses, cut as a layout cuts them."""

    loss: torch.Tensor  # [G, T] l = -A_i log p, 0 where ignored (in the graph)
    valid: torch.Tensor  # [G, T] bool
    length: torch.Tensor  # [G] |o_i|
    group: torch.Tensor  # [G] the prompt of each row
    dp: int
    sp: int
    grad_accum: int
    max_response: int

    @property
    def B(self) -> int:
        return self.loss.shape[0]

    @property
    def N(self) -> int:
        return int(self.valid.sum())

    def rows(self, r: int, m: int) -> slice:
        per_micro = self.B // (self.dp * self.grad_accum)
        start = (r * self.grad_accum + m) * per_micro
        return slice(start, start + per_micro)

    def cols(self, s: int) -> slice:
        width = self.loss.shape[1] // self.sp
        return slice(s * width, (s + 1) * width)

    def n(self, rows: slice) -> torch.Tensor:
        return self.valid[rows].sum(1).float()

    def micro_step_tokens(self, m: int) -> int:
        """The tokens of micro-step m over every dp rank."""
        return sum(int(self.valid[self.rows(r, m)].sum()) for r in range(self.dp))


def step_from(model, batch, dp: int, sp: int, grad_accum: int, max_response: int) -> Step:
    logits = model(batch.inputs)
    valid = batch.labels != IGNORE
    ce = F.cross_entropy(logits.flatten(0, 1).float(), batch.labels.flatten(), ignore_index=IGNORE, reduction="none")
    loss = batch.responses.advantage[:, None] * ce.view(batch.labels.shape)  # -A log p = A x CE
    return Step(loss, valid, batch.responses.length, batch.responses.group, dp, sp, grad_accum, max_response)


def per_micro_batch(s: Step, f) -> torch.Tensor:
    """(1/dp) sum_r sum_m f(rows): each micro-batch's loss on whole sequences, FSDP's mean over the world."""
    return sum(f(s.rows(r, m)) for r in range(s.dp) for m in range(s.grad_accum)) / s.dp


def cp_count(s: Step) -> torch.Tensor:
    """sum over sp chunks of (the chunk's l) / (the chunk's tokens over every row)."""
    return sum(s.loss[:, s.cols(c)].sum() / int(s.valid[:, s.cols(c)].sum()) for c in range(s.sp))


def dapo_spg1(s: Step, window_factor: bool) -> torch.Tensor:
    """TRL dapo, a generation batch per micro-step: its tokens / processes (x GA after PR #6024)."""
    ga = s.grad_accum if window_factor else 1
    return per_micro_batch(s, lambda rows: s.loss[rows].sum() / (s.micro_step_tokens(_micro(s, rows)) / s.dp * ga))


def _micro(s: Step, rows: slice) -> int:
    return (rows.start // (s.B // (s.dp * s.grad_accum))) % s.grad_accum


def dapo_paper(s: Step) -> torch.Tensor:
    prompts = int(s.group.max()) + 1
    return sum(s.loss[s.group == g].sum() / s.length[s.group == g].sum().float() for g in range(prompts)) / prompts


# preset name: the objective J its rule's gradient is, at this layout.
REFERENCES = {
    "reference": lambda s: s.loss.sum() / s.N,  # reduction=sum: grad L, the token mean
    "verl_token_mean": lambda s: per_micro_batch(s, lambda rows: s.loss[rows].sum() / s.N * s.dp),
    "verl_token_sum": lambda s: per_micro_batch(s, lambda rows: s.loss[rows].sum() * s.dp),
    "verl_seq_mean_token_sum": lambda s: per_micro_batch(s, lambda rows: s.loss[rows].sum() / s.B * s.dp),
    "verl_seq_mean_token_mean": lambda s: per_micro_batch(
        s, lambda rows: (s.loss[rows].sum(1) / s.n(rows)).sum() / s.B * s.dp
    ),
    "verl_seq_mean_token_sum_norm": lambda s: per_micro_batch(
        s, lambda rows: s.loss[rows].sum() / s.B * s.dp / s.n(rows).max()
    ),
    "verl_seq_mean_token_sum_norm_constant": lambda s: per_micro_batch(
        s, lambda rows: s.loss[rows].sum() / s.B * s.dp / s.max_response
    ),
    "verl_legacy_token_mean": lambda s: per_micro_batch(
        s, lambda rows: s.loss[rows].sum() / s.n(rows).sum() / s.grad_accum
    ),
    "verl_cp_count_token_mean": cp_count,
    "trl_grpo": lambda s: per_micro_batch(s, lambda rows: (s.loss[rows].sum(1) / s.n(rows)).mean() / s.grad_accum),
    "trl_bnpo": lambda s: per_micro_batch(s, lambda rows: s.loss[rows].sum() / s.n(rows).sum() / s.grad_accum),
    "trl_dr_grpo": lambda s: per_micro_batch(
        s, lambda rows: s.loss[rows].sum() / ((rows.stop - rows.start) * s.max_response) / s.grad_accum
    ),
    "trl_dapo": lambda s: per_micro_batch(s, lambda rows: s.loss[rows].sum() / (s.N / s.dp)),
    "trl_dapo_spg1": lambda s: dapo_spg1(s, window_factor=True),
    "trl_dapo_spg1_before_6024": lambda s: dapo_spg1(s, window_factor=False),
    "paper_grpo": lambda s: (s.loss.sum(1) / s.length.float()).sum() / s.B,
    "paper_dapo": dapo_paper,
    "paper_dr_grpo": lambda s: s.loss.sum() / (s.B * s.max_response),
}
