"""Single-process references of the known bugs' arms (conf/bug/): each pre-fix (and fixed) formula written out
on the whole step, in the notation of tests/trainer_references.py (Blocks: S[r, s, m], n[r, s, m]).

Nothing here imports runner.trainers. An arm is its rule and FSDP's reduction: (custom.fn, custom.fsdp_reduce)
-> (shard_loss(blocks, r, s, m), after(blocks)); the objective is after * (1/W under FSDP's mean) * sum_rsm
shard_loss, as there. The trainers' own rules that an arm reuses come from trainer_references.RULES.
"""

from __future__ import annotations

import torch
from trainer_references import RULES, Blocks, safe_div


def _trainer(name: str):
    _, shard_loss, after = RULES[name]
    return shard_loss, after


ARMS = {
    ("runner.trainers.hf_trainer:loss", "mean"): _trainer("hf_trainer"),
    ("runner.trainers.hf_trainer:loss_per_device", "mean"): _trainer("hf_trainer_per_device"),
    ("runner.trainers.hf_trainer:no_loss_kwargs", "mean"): _trainer("hf_trainer_no_loss_kwargs"),
    ("runner.trainers.megatron:default", "mean"): _trainer("megatron_default"),
    ("runner.trainers.megatron:per_token", "sum"): _trainer("megatron"),
    ("runner.trainers.torchtitan:loss", "sum"): _trainer("torchtitan"),
    # torchtitan #2318: S / N (the global count) with the replicas' mean left on.
    ("runner.trainers.torchtitan:loss", "mean"): (lambda b, r, s, m: b.S(r, s, m) / b.N, lambda b: 1),
    # transformers 4.46.0 to 4.47.1: the model's token mean of the shard, never divided by M.
    ("runner.trainers.transformers_bugs:double_ga", "mean"): (
        lambda b, r, s, m: safe_div(b.S(r, s, m), b.n(r, s, m)),
        lambda b: 1,
    ),
    # transformers PR #46775's report: W S / (the shards' count divided by sp, N / sp).
    ("runner.trainers.transformers_bugs:ulysses_count", "mean"): (
        lambda b, r, s, m: b.world_size * b.S(r, s, m) / (b.N / b.sp),
        lambda b: 1,
    ),
    # verl before #5625: the micro-batch's token mean x its share of the rank's samples (1 / M, equal rows).
    ("runner.trainers.verl_ga_weights:sample_ratio_ga", "mean"): (
        lambda b, r, s, m: safe_div(b.S(r, s, m), b.n(r, s, m)) / b.grad_accum,
        lambda b: 1,
    ),
    # verl after: masked sum / the global count x dp_size.
    ("runner.trainers.verl_ga_weights:token_mean", "mean"): (lambda b, r, s, m: b.S(r, s, m) / b.N * b.dp, lambda b: 1),
    # VeOmni before and after PR #862: both the step's token mean W S / N (the bug is in the grad norm alone).
    ("runner.trainers.veomni_grad_norm:norm_over_fsdp_group", "mean"): (
        lambda b, r, s, m: b.world_size * b.S(r, s, m) / b.N,
        lambda b: 1,
    ),
    ("runner.trainers.veomni_grad_norm:norm_over_shard_group", "mean"): (
        lambda b, r, s, m: b.world_size * b.S(r, s, m) / b.N,
        lambda b: 1,
    ),
}


def arm_objective(b: Blocks, fn: str, fsdp: str) -> torch.Tensor:
    """J of the arm (fn, fsdp) on this layout."""
    shard_loss, after = ARMS[(fn, fsdp)]
    total = sum(shard_loss(b, *shard) for shard in b.shards())
    return after(b) * (total / b.world_size if fsdp == "mean" else total)
