"""Single-process references of the trainers' rules: each upstream formula written out here, on the whole step.

Nothing here imports runner.trainers. From the step's global batch, the model (unsharded, one process)
gives every target's loss l[i, t] (0 where ignored). The layout cuts it into the blocks each rank
sees: dp rank r's rows, micro-batch m's rows within them, sp shard s's columns. A rule is what each
block backpropagates (`shard_loss`, the trainer's formula), how FSDP combines the ranks (mean: 1/W,
or sum), and what the trainer multiplies the reduced gradients by afterwards (`after`): the reference
objective is

    J = after * (1/W if FSDP mean else 1) * sum_rsm shard_loss(r, s, m),

and its gradient is what the rule, run distributed, must give.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

IGNORE = -100


@dataclass
class Blocks:
    """A step cut as a layout cuts it: S[r, s, m] (token-loss sums, in the graph), n[r, s, m] (valid counts)."""

    loss: torch.Tensor  # l[i, t], [G, T], 0 where ignored
    valid: torch.Tensor  # [G, T] bool
    dp: int
    sp: int
    grad_accum: int

    @property
    def world_size(self) -> int:
        return self.dp * self.sp

    def rows(self, r: int, m: int | None = None) -> slice:
        per_rank = self.loss.shape[0] // self.dp
        if m is None:
            return slice(r * per_rank, (r + 1) * per_rank)
        per_micro = per_rank // self.grad_accum
        start = r * per_rank + m * per_micro
        return slice(start, start + per_micro)

    def cols(self, s: int | None) -> slice:
        if s is None:
            return slice(None)
        width = self.loss.shape[1] // self.sp
        return slice(s * width, (s + 1) * width)

    def S(self, r, s=None, m=None) -> torch.Tensor:
        return self.loss[self.rows(r, m), self.cols(s)].sum()

    def n(self, r, s=None, m=None) -> int:
        return int(self.valid[self.rows(r, m), self.cols(s)].sum())

    @property
    def N(self) -> int:
        return int(self.valid.sum())

    def shards(self):
        return [(r, s, m) for r in range(self.dp) for s in range(self.sp) for m in range(self.grad_accum)]


def token_losses(model, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(l[i, t], valid[i, t]) of the whole batch, from one unsharded forward."""
    logits = model(inputs)
    valid = labels != IGNORE
    losses = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE, reduction="none")
    return losses.view(labels.shape), valid


def row_weights(b: Blocks, reduction: str) -> torch.Tensor:
    """xtuner's loss_reduction weights per target: 1 (token), 1/n_row (sample), 1/sqrt(n_row) (square); 0 if ignored."""
    n_row = b.valid.sum(dim=1, keepdim=True).float()
    per_row = {"token": torch.ones_like(n_row), "sample": 1 / n_row, "square": 1 / n_row.sqrt()}[reduction]
    return torch.where(b.valid, per_row.expand_as(b.loss), torch.zeros_like(b.loss))


def xtuner_weighted(b: Blocks, reduction: str, r, s, m) -> torch.Tensor:
    """sum over the shard of l x w / D, D the weights' sum over the whole step (build_batches, loss_fn)."""
    w = row_weights(b, reduction)
    block = (b.rows(r, m), b.cols(s))
    return (b.loss[block] * w[block]).sum() / w.sum()


def safe_div(total: torch.Tensor, count: float) -> torch.Tensor:
    """total / count where there are targets; a shard without any backpropagates nothing (its loss may be NaN)."""
    return total / count if count > 0 else total * 0


# name: (FSDP reduction, shard_loss(blocks, r, s, m), after(blocks)) -- each the trainer's formula.
RULES = {
    # transformers Trainer: ForCausalLMLoss(sum / num_items_in_batch) x num_processes; N gathered, / cp.
    "hf_trainer": ("mean", lambda b, r, s, m: b.world_size * b.S(r, s, m) / b.N, lambda b: 1),
    # average_tokens_across_devices=False: num_items = this dp rank's whole-sequence count / cp (true division).
    "hf_trainer_per_device": ("mean", lambda b, r, s, m: safe_div(b.S(r, s, m), b.n(r) / b.sp), lambda b: 1),
    # model_accepts_loss_kwargs=False: the model's token mean of its shard, / gradient-accumulation steps.
    "hf_trainer_no_loss_kwargs": (
        "mean",
        lambda b, r, s, m: safe_div(b.S(r, s, m), b.n(r, s, m)) / b.grad_accum,
        lambda b: 1,
    ),
    # deepspeed_sp_compute_loss: own share of the micro-batch's token mean over SP (clamp 1), / GA; DeepSpeed
    # sums over SP and averages over DP: sp x the mean over W. (At sp = 1 the default path, as hf_trainer.)
    "hf_trainer_ulysses": (
        "mean",
        lambda b, r, s, m: (
            b.S(r, s, m) / max(b.n(r, None, m), 1) / b.grad_accum if b.sp > 1 else b.world_size * b.S(r, s, m) / b.N
        ),
        lambda b: b.sp,
    ),
    # Megatron calculate_per_token_loss=True: S backpropagated, DDP SUM, then x 1/clamp(num_tokens, 1).
    "megatron": ("sum", lambda b, r, s, m: b.S(r, s, m), lambda b: 1 / max(b.N, 1)),
    # Megatron default: S / clamp(n_shard, 1) / num_microbatches, DDP mean over dp x cp.
    "megatron_default": ("mean", lambda b, r, s, m: b.S(r, s, m) / max(b.n(r, s, m), 1) / b.grad_accum, lambda b: 1),
    # xtuner released: weighted sum / D, all-reduced with torch.distributed.nn (SUM backward: each shard's loss
    # receives W), FSDP mean.
    "xtuner": ("mean", lambda b, r, s, m: b.world_size * xtuner_weighted(b, "token", r, s, m), lambda b: 1),
    "xtuner_sample": ("mean", lambda b, r, s, m: b.world_size * xtuner_weighted(b, "sample", r, s, m), lambda b: 1),
    "xtuner_square": ("mean", lambda b, r, s, m: b.world_size * xtuner_weighted(b, "square", r, s, m), lambda b: 1),
    # RFC #1335: the all-reduce dropped, FSDP mean kept.
    "xtuner_rfc": ("mean", lambda b, r, s, m: xtuner_weighted(b, "token", r, s, m), lambda b: 1),
    # PR #1968: the all-reduce dropped, FSDP SUM.
    "xtuner_pr1968": ("sum", lambda b, r, s, m: xtuner_weighted(b, "token", r, s, m), lambda b: 1),
    # torchtitan: cross_entropy_loss sum / global_valid_tokens, FSDP gradient division disabled.
    "torchtitan": ("sum", lambda b, r, s, m: b.S(r, s, m) / b.N, lambda b: 1),
    # The counterexample: AR(S / N) with a SUM backward (each shard's loss receives W) under FSDP SUM.
    "sum_under_fsdp_sum": ("sum", lambda b, r, s, m: b.world_size * b.S(r, s, m) / b.N, lambda b: 1),
}


def objective(b: Blocks, rule: str) -> torch.Tensor:
    """J for `rule` on this layout (module docstring)."""
    fsdp, shard_loss, after = RULES[rule]
    total = sum(shard_loss(b, *shard) for shard in b.shards())
    return after(b) * (total / b.world_size if fsdp == "mean" else total)
