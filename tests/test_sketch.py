"""The gradient sketch of a sharded world equals <p_k, g> of the full gradient in one process.

W=3 shards every dimension unevenly (256 / 3, 64 / 3): each rank's slice of
every projection must still line up with its shard of the gradient.
"""

from __future__ import annotations

import pytest
import torch
from gloo_world import run_in_world
from helpers import run_config

from runner.config import Reduction
from runner.data import GlobalBatches, load_documents, local_micro_batches
from runner.gradients import GradientSketch
from runner.layout import ParallelLayout
from runner.model import build_model
from runner.parallel import build_meshes, parallelize
from runner.reduction import LossReducer, forward_backward
from runner.train import world_gather

WORLD_SIZE = 3
CFG = dict(train__seq_len=32, train__global_batch=6, seed=5, metrics__sketch_dim=4)


def sharded_sketch() -> tuple[list[float], dict[str, torch.Tensor], float, float]:
    """On every rank: (the world's sketch, the full gradient, step time, skew) after one `sum` backward."""
    cfg = run_config(**CFG)
    meshes = build_meshes(ParallelLayout(WORLD_SIZE, 1, 1), "cpu")
    batch = GlobalBatches(load_documents(cfg.data), seq_len=32, global_batch=6, seed=cfg.seed, packing=False)(1)
    micro_batches = local_micro_batches(batch, dp=WORLD_SIZE, dp_rank=meshes.dp_rank, sp=1, sp_rank=0, grad_accum=1)
    model = parallelize(build_model(cfg.model, cfg.seed), meshes, Reduction.sum)
    forward_backward(model, micro_batches, LossReducer(Reduction.sum, meshes.world_group, 1), torch.device("cpu"))
    sketch = GradientSketch(model, cfg.metrics.sketch_dim, cfg.metrics.sketch_seed)
    rank = meshes.dp_rank
    step_time, skew, world = world_gather(0.1 * (rank + 1), 100.0 + rank, sketch.partial_sums(), meshes.world_group, torch.device("cpu"))
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
