"""Mixed precision (`mp.param_dtype`, `mp.reduce_dtype`) through FSDP2 on a real two-rank gloo world.

A bfloat16 gradient reduction must give the float32 reduction's gradient to
bfloat16's precision, in every mode, `fsdp_sum` (a forced SUM) included: a
zeroed or rescaled gradient (PREMUL_SUM's known bf16 failure) fails here.
"""

from __future__ import annotations

import pytest
import torch

from runner.data.batches import GlobalBatches, load_documents, local_micro_batches
from runner.layout import ParallelLayout
from runner.model.parallel import build_meshes, parallelize
from runner.model.registry import build_model
from runner.modes import Reduction, facts
from runner.testing.local_world import run_in_world
from runner.train.reduction import LossReducer, forward_backward
from tests.helpers import run_config

MODES = (Reduction.sum, Reduction.local, Reduction.fsdp_sum, Reduction.scaled)
PRECISIONS = {"fp32": ("float32", "float32"), "bf16_reduce": ("float32", "bfloat16"), "bf16": ("bfloat16", "bfloat16")}
# bfloat16 keeps 8 significant bits (relative rounding 2^-9 = 0.2 %); a sum of
# two rounded shards and a bf16 forward stay well inside these bounds.
MIN_COSINE = {"bf16_reduce": 0.9999, "bf16": 0.995}
MAX_NORM_RATIO_ERROR = {"bf16_reduce": 0.005, "bf16": 0.02}


def step_one_gradients() -> dict:
    """On every rank: each (mode, precision)'s full step-1 gradient as one float32 vector."""
    results = {}
    for name, (param_dtype, reduce_dtype) in PRECISIONS.items():
        precision = {"mp.param_dtype": param_dtype, "mp.reduce_dtype": reduce_dtype}
        cfg = run_config(**{"train.seq_len": 32, "train.global_batch": 8, "grad_accum": 2, **precision})
        meshes = build_meshes(ParallelLayout(2, 1, 2), "cpu")
        batch = GlobalBatches(load_documents(cfg.data), seq_len=32, global_batch=8, seed=cfg.seed, packing=False)(1)
        micro_batches = local_micro_batches(batch, dp=2, dp_rank=meshes.dp_rank, sp=1, sp_rank=0, grad_accum=2)
        for mode in MODES:
            model = parallelize(build_model(cfg.model, cfg.seed), meshes, facts(mode).fsdp_reduction, cfg.mp)
            forward_backward(model, micro_batches, LossReducer(mode, meshes.world_group, 2), torch.device("cpu"))
            grads = [p.grad.full_tensor().float().flatten() for p in model.parameters()]
            assert all(p.grad.dtype == torch.float32 for p in model.parameters())  # sharded grads stay fp32
            results[mode, name] = torch.cat(grads)
    return results


@pytest.fixture(scope="module")
def gradients() -> dict:
    return run_in_world(step_one_gradients, 2)[0]


@pytest.mark.parametrize("precision", ["bf16_reduce", "bf16"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_bfloat16_matches_float32(gradients, mode, precision):
    full, low = gradients[mode, "fp32"], gradients[mode, precision]
    cosine = torch.nn.functional.cosine_similarity(full, low, dim=0).item()
    norm_ratio = (low.norm() / full.norm()).item()
    assert cosine >= MIN_COSINE[precision], f"{mode.value} {precision}: cosine {cosine:.6f}"
    assert abs(norm_ratio - 1) <= MAX_NORM_RATIO_ERROR[precision], (
        f"{mode.value} {precision}: norm ratio {norm_ratio:.5f}"
    )


def test_bfloat16_keeps_the_modes_factors(gradients):
    """local is sum / W in bf16 as in fp32; fsdp_sum and scaled are sum."""
    for precision in PRECISIONS:
        reference = gradients[Reduction.sum, precision].norm()
        assert gradients[Reduction.local, precision].norm() / reference == pytest.approx(0.5, rel=0.01)
        assert gradients[Reduction.fsdp_sum, precision].norm() / reference == pytest.approx(1.0, rel=0.01)
        assert gradients[Reduction.scaled, precision].norm() / reference == pytest.approx(1.0, rel=0.01)
