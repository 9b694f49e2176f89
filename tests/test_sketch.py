"""The gradient sketch of a sharded world equals <p_k, g> of the full gradient in one process.

W=3 shards every dimension unevenly (256 / 3, 64 / 3): each rank's slice of
every projection must still line up with its shard of the gradient.
"""

from __future__ import annotations

import pytest
import torch
from gloo_world import run_in_world
from helpers import run_config

from runner.data.batches import GlobalBatches, load_documents, local_micro_batches
from runner.layout import ParallelLayout
from runner.model.parallel import build_meshes, parallelize
from runner.model.registry import build_model
from runner.modes import Reduction
from runner.train.gradients import GradientSketch, clip_gradients
from runner.train.meter import world_gather
from runner.train.reduction import LossReducer, forward_backward

WORLD_SIZE = 3
CFG = dict(train__seq_len=32, train__global_batch=6, seed=5, metrics__sketch_dim=4)


def sharded_sketch() -> tuple[list[float], dict[str, torch.Tensor], float, float]:
    """On every rank: (the world's sketch, the full gradient, step time, skew) after one `sum` backward."""
    cfg = run_config(**CFG)
    meshes = build_meshes(ParallelLayout(WORLD_SIZE, 1, 1), "cpu")
    batch = GlobalBatches(load_documents(cfg.data), seq_len=32, global_batch=6, seed=cfg.seed, packing=False)(1)
    micro_batches = local_micro_batches(batch, dp=WORLD_SIZE, dp_rank=meshes.dp_rank, sp=1, sp_rank=0, grad_accum=1)
    model = parallelize(build_model(cfg.model, cfg.seed), meshes)
    forward_backward(model, micro_batches, LossReducer(Reduction.sum, meshes.world_group, 1), torch.device("cpu"))
    sketch = GradientSketch(model, cfg.metrics.sketch_dim, cfg.metrics.sketch_seed)
    rank = meshes.dp_rank
    # Two steps' rows: the second step's times are the first's reversed over ranks, its sketch doubled.
    rows = torch.stack([
        torch.cat([torch.tensor([0.1 * (rank + 1), 100.0 + rank], dtype=torch.float64), sketch.partial_sums()]),
        torch.cat([torch.tensor([0.1 * (WORLD_SIZE - rank), 200.0 - 2 * rank], dtype=torch.float64), 2 * sketch.partial_sums()]),
    ])  # fmt: skip
    (step_time, skew, *world), (step_time_2, skew_2, *world_2) = world_gather(
        rows, meshes.world_group, torch.device("cpu")
    ).tolist()
    assert (step_time_2, skew_2) == (pytest.approx(step_time), pytest.approx(2 * skew))
    assert world_2 == [2 * value for value in world]
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    return world, grads, step_time, skew


def test_sharded_sketch_equals_the_full_gradients_projection():
    results = run_in_world(sharded_sketch, WORLD_SIZE)
    world, grads, step_time, skew = results[0]
    assert all(other[0] == world for other in results[1:])  # every rank holds the same bits
    assert step_time == pytest.approx(0.3) and skew == pytest.approx(2.0)  # max elapsed; latest - earliest arrival
    cfg = run_config(**CFG)
    reference = build_model(cfg.model, cfg.seed)
    for name, param in reference.named_parameters():
        param.grad = grads[name]
    expected = GradientSketch(reference, cfg.metrics.sketch_dim, cfg.metrics.sketch_seed).partial_sums().tolist()
    assert len(world) == 4 and max(abs(v) for v in expected) > 0
    assert world == pytest.approx(expected, rel=1e-10, abs=1e-14)


def clipped_both_ways() -> tuple[float, float, float, list[bool]]:
    """On every rank: (norm, factor) of `clip_gradients`, and whether each clipped shard equals torch's on the same gradients."""
    cfg = run_config(**CFG)
    meshes = build_meshes(ParallelLayout(WORLD_SIZE, 1, 1), "cpu")
    batch = GlobalBatches(load_documents(cfg.data), seq_len=32, global_batch=6, seed=cfg.seed, packing=False)(1)
    micro_batches = local_micro_batches(batch, dp=WORLD_SIZE, dp_rank=meshes.dp_rank, sp=1, sp_rank=0, grad_accum=1)
    models = [parallelize(build_model(cfg.model, cfg.seed), meshes) for _ in range(2)]
    for model in models:
        forward_backward(model, micro_batches, LossReducer(Reduction.sum, meshes.world_group, 1), torch.device("cpu"))
    norm, factor = clip_gradients(models[0], 0.5)
    torch_norm = torch.nn.utils.clip_grad_norm_(models[1].parameters(), 0.5).full_tensor().item()
    same = [
        torch.equal(a.grad.to_local(), b.grad.to_local())
        for a, b in zip(models[0].parameters(), models[1].parameters())
    ]
    return norm, factor, torch_norm, same


def test_clipping_local_shards_gives_torchs_clip_grad_norm_bits():
    for norm, factor, torch_norm, same in run_in_world(clipped_both_ways, WORLD_SIZE):
        assert norm == torch_norm and factor < 1  # 0.5 is below this step's norm: the factor is applied
        assert all(same)
