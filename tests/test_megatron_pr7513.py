"""Megatron-LM PR #7513's own change (runner.trainers.megatron:pr_7513), measured: a count summed over the cp
group per micro-batch and the loss x cp, under DDP's mean over dp x cp, gives grad L with one data-parallel rank
and one micro-batch, and another direction wherever the dp ranks' or the micro-batches' counts differ.

Real gloo worlds, skewed valid-token counts (so that counts differ), against `sum` (grad L, checked against a
single process elsewhere) on the same step; Megatron's default path beside it (shard-local counts: another
direction at every cp > 1 layout).
"""

from __future__ import annotations

import pytest
import torch
from gloo_world import run_in_world
from helpers import run_config, step_one_through_parts

from runner.layout import ParallelLayout
from runner.model.parallel import build_meshes

RULES = {"pr_7513": "runner.trainers.megatron:pr_7513", "default": "runner.trainers.megatron:default"}
CFG = dict(train__seq_len=64, train__global_batch=8, data__valid_tokens="skewed", seed=3)


def gradients(layout: ParallelLayout) -> dict:
    """On every rank: step 1's full gradient of `sum` and of each rule (FSDP mean), rank 0's."""
    meshes = build_meshes(layout, "cpu")
    shape = dict(world_size=layout.world_size, sp=layout.sp, grad_accum=layout.grad_accum, **CFG)
    configs = {"sum": run_config(reduction="sum", **shape)}
    for name, fn in RULES.items():
        configs[name] = run_config(reduction="custom", custom__fn=fn, custom__fsdp_reduce="mean", **shape)
    out = {}
    for name, cfg in configs.items():
        _, parts = step_one_through_parts(cfg, meshes)
        out[name] = torch.cat([p.grad.full_tensor().flatten() for p in parts.model.parameters()])
    return out


def against_sum(grads: dict, name: str) -> tuple[float, float]:
    """(cosine, norm ratio) of a rule's gradient against sum's."""
    rule, true = grads[name].double(), grads["sum"].double()
    return float(rule @ true / (rule.norm() * true.norm())), float(rule.norm() / true.norm())


@pytest.mark.slow
def test_pr_7513_gives_grad_l_only_with_one_dp_rank_and_one_micro_batch():
    one = run_in_world(gradients, 2, ParallelLayout(2, 2, 1))[0]  # dp 1, cp 2, M 1
    cosine, ratio = against_sum(one, "pr_7513")
    assert cosine == pytest.approx(1, abs=1e-6) and ratio == pytest.approx(1, rel=1e-5), (cosine, ratio)
    assert against_sum(one, "default")[0] < 0.9999  # the shard-local counts it fixes: another direction here

    accumulated = run_in_world(gradients, 2, ParallelLayout(2, 2, 2))[0]  # dp 1, cp 2, M 2
    assert against_sum(accumulated, "pr_7513")[0] < 0.9999
    data_parallel = run_in_world(gradients, 4, ParallelLayout(4, 2, 1))[0]  # dp 2, cp 2, M 1
    assert against_sum(data_parallel, "pr_7513")[0] < 0.9999
