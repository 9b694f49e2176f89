"""`autograd_all_reduce`: each implementation's backward, measured in gloo worlds, and what it makes of `sum`.

The primitive: every rank seeds its reduced value with 1; what reaches its
input is W for a SUM backward (funcol, torch_nn), 1 for identity. Then the
whole `sum` mode, step 1, against the single-process reference gradient dL:
dL for funcol and torch_nn, dL / W for identity (as `local`), at W=2 GA=2 and
at W=4 sp=2 (dp=2).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_world import run_in_world
from helpers import run_config, step_one_batch, step_one_through_parts

from runner.data.batches import IGNORE_INDEX
from runner.layout import ParallelLayout
from runner.model.parallel import build_meshes
from runner.model.registry import build_model
from runner.modes import ALL_REDUCE_BACKWARD, AutogradAllReduce, Reduction, run_gradient
from runner.train.all_reduce import differentiable_all_reduce

CFG = dict(train__seq_len=64, train__global_batch=12, seed=3)
LAYOUTS = {"W2-GA2": ParallelLayout(2, 1, 2), "W4-SP2": ParallelLayout(4, 2, 2)}


def backward_of_each() -> dict:
    """Per implementation: (forward value, what rank r's input receives, deprecation warnings over 3 calls)."""
    rank = dist.get_rank()
    out = {}
    for implementation in AutogradAllReduce:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):  # as three micro-batches would
                x = torch.tensor(float(rank + 1), requires_grad=True)
                y = differentiable_all_reduce(x, dist.group.WORLD, implementation)
                y.backward()
        deprecations = [w for w in caught if issubclass(w.category, FutureWarning) and "deprecated" in str(w.message)]
        out[implementation.value] = (y.item(), x.grad.item(), len(deprecations))
    return out


def test_each_implementations_backward_is_the_documented_one(world):
    layout, per_rank = world
    world_size, results = layout.world_size, [r["primitive"] for r in per_rank]
    total = world_size * (world_size + 1) / 2
    for implementation in AutogradAllReduce:
        received = world_size if ALL_REDUCE_BACKWARD[implementation] == "sum" else 1
        for rank_result in results:
            value, grad, _ = rank_result[implementation.value]
            assert value == total and grad == received, (implementation, rank_result)
    # torch.distributed.nn.functional.all_reduce warns on every call; the rank shows it once, then ignores it.
    assert [r["torch_nn"][2] for r in results] == [1] * world_size
    assert [r["funcol"][2] + r["identity"][2] for r in results] == [0] * world_size


def in_world(layout: ParallelLayout) -> dict:
    """The primitive's backward (first: its deprecation warning is counted), then `sum`'s step-1 gradients."""
    return {"primitive": backward_of_each(), "sum": sum_mode_gradients(layout)}


def sum_mode_gradients(layout: ParallelLayout) -> dict:
    """Step-1 (loss, full gradient) of `sum` with each implementation, in this world."""
    meshes = build_meshes(layout, "cpu")
    out = {}
    for implementation in AutogradAllReduce:
        cfg = run_config(
            reduction="sum",
            autograd_all_reduce=implementation.value,
            world_size=layout.world_size,
            sp=layout.sp,
            grad_accum=layout.grad_accum,
            **CFG,
        )
        step, parts = step_one_through_parts(cfg, meshes)
        out[implementation.value] = (step.loss, {n: p.grad.full_tensor() for n, p in parts.model.named_parameters()})
    return out


@pytest.fixture(scope="module")
def reference():
    cfg = run_config(**CFG)
    batch = step_one_batch(cfg)  # the runner's own data, as the ranks draw it
    model = build_model(cfg.model, cfg.seed)
    loss = F.cross_entropy(model(batch.inputs).flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX)
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.fixture(scope="module", params=list(LAYOUTS), ids=list(LAYOUTS))
def world(request):
    layout = LAYOUTS[request.param]
    return layout, run_in_world(in_world, layout.world_size, layout)


@pytest.mark.parametrize("implementation", [a.value for a in AutogradAllReduce])
def test_sum_gets_grad_L_with_a_sum_backward_and_grad_L_over_W_with_identity(world, reference, implementation):
    layout, per_rank = world
    ref_loss, ref_grads = reference
    loss, grads = per_rank[0]["sum"][implementation]
    assert loss == pytest.approx(ref_loss, rel=1e-5)  # the forward value is L whatever the backward
    factor = {"grad L": 1.0, "grad L / W": 1.0 / layout.world_size}[run_gradient(Reduction.sum, implementation)]
    assert factor == (1.0 if implementation != "identity" else 1.0 / layout.world_size)
    for name, ref_grad in ref_grads.items():
        torch.testing.assert_close(grads[name], ref_grad * factor, msg=lambda m: f"{implementation} {name}: {m}")
