"""HSDP (`dp_replicate` = R > 1): FSDP2 on a 2-D (replicate, shard) mesh, against the single-process reference.

Real gloo worlds of CPU ranks running the runner's own pieces (`build_meshes`,
`parallelize`, the data split, LossReducer, forward_backward, the grad norm,
clipping and the sketch). The reference trains the same seed-initialised model
on the whole global batch in one process with PyTorch's token-mean cross
entropy: the gradient of L.

What FSDP2 does with the gradients under HSDP is measured first, on a model
small enough to see each rank's share: rank r's gradient is (r + 1) g, so a
mean over all W = 4 ranks is 2.5 g, a sum 10 g, and a mean or sum over one
replica's shards alone 1.5 g or 3 g (replica 0). Then every mode's gradient
is the multiple of grad L it is at R = 1 (tests/test_gradients.py's FACTOR):
FSDP's mean is over all W ranks.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from gloo_world import run_in_world
from helpers import run_config, step_one_batch
from test_gradients import FACTOR
from torch.distributed.fsdp import FSDPModule, fully_shard

from runner.data.batches import IGNORE_INDEX, local_micro_batches
from runner.layout import ParallelLayout
from runner.model.parallel import build_meshes, parallelize, set_gradient_reduction
from runner.model.registry import build_model
from runner.modes import BUILT_IN, Reduction, facts
from runner.train.counter import CollectiveCounter
from runner.train.gradients import GradientSketch, clip_gradients
from runner.train.reduction import LossReducer, forward_backward

CFG = dict(train__seq_len=64, train__global_batch=16, seed=3, metrics__sketch_dim=4)  # 16 splits over every layout


# --- FSDP2's own reduction under HSDP, on gloo ---------------------------------------------------------


def _tiny_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 2, bias=False))


def _weighted_backward(model: nn.Module, group_kinds: dict) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """Rank r backpropagates (r + 1) * sum(model(ones)): its gradient is (r + 1) g. Returns the full gradients
    and the collectives' calls by kind."""
    counter = CollectiveCounter(group_kinds)
    with counter:
        ((dist.get_rank() + 1) * model(torch.ones(1, 4)).sum()).backward()
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    model.zero_grad()
    return grads, {kind: c["calls"] for kind, c in counter.take().items()}


def _placements(param) -> tuple[str, ...]:
    return tuple(
        "Replicate" if p.is_replicate() else f"Shard({p.dim})" if p.is_shard() else str(p) for p in param.placements
    )


def fsdp_reduction_probe() -> dict:
    """On every rank of W=4 as DP(2x2): FSDP's reduction as built, forced SUM, the mean restored, factor W."""
    meshes = build_meshes(ParallelLayout(4, 1, 1, dp_replicate=2), "cpu")
    model = _tiny_model()
    fully_shard(model[0], mesh=meshes.fsdp)  # as `parallelize` shards: the units, then the root
    fully_shard(model, mesh=meshes.fsdp)
    out = {"placements": {name: _placements(p) for name, p in model.named_parameters()}}
    kinds = meshes.group_kinds()
    out["mean"], out["calls"] = _weighted_backward(model, kinds)
    set_gradient_reduction(model, "sum")
    out["sum"], _ = _weighted_backward(model, kinds)
    set_gradient_reduction(model, "mean")  # as the cost loop switches arms
    out["mean again"], _ = _weighted_backward(model, kinds)
    for module in model.modules():  # an explicit divide factor W, as the mean was set before HSDP
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(4.0)
    try:
        _weighted_backward(model, kinds)
        out["factor W"] = "ran"
    except RuntimeError as error:
        out["factor W"] = str(error)
    return out


@pytest.fixture(scope="module")
def probe() -> dict:
    return run_in_world(fsdp_reduction_probe, 4)[0]


@pytest.fixture(scope="module")
def unit_gradient() -> dict[str, torch.Tensor]:
    model = _tiny_model()
    model(torch.ones(1, 4)).sum().backward()
    return {name: p.grad for name, p in model.named_parameters()}


def test_hsdp_places_parameters_replicated_and_sharded(probe):
    assert set(probe["placements"].values()) == {("Replicate", "Shard(0)")}
    # Per FSDP unit (2): a reduce-scatter over the shards, then an all-reduce over the replicas (counted apart
    # from the loss's all-reduces, of which this backward has none).
    assert probe["calls"]["reduce_scatter"] == 2 and probe["calls"]["replica_all_reduce"] == 2
    assert "all_reduce" not in probe["calls"]


@pytest.mark.parametrize("setting, factor", [("mean", 2.5), ("sum", 10.0), ("mean again", 2.5)])
def test_fsdp_reduction_spans_replicas_and_shards(probe, unit_gradient, setting, factor):
    """mean: (1 + 2 + 3 + 4) / 4 = 2.5 (over one replica's shards it would be 1.5); sum: 10 (not 3)."""
    for name, g in unit_gradient.items():
        torch.testing.assert_close(probe[setting][name], g * factor, msg=lambda m: f"{setting} {name}: {m}")


def test_a_divide_factor_of_w_is_premul_sum_which_gloo_lacks(probe):
    """Why the mean is FSDP's default and not "divide by W": W is not the reduce-scatter group's size under HSDP."""
    assert "PREMUL_SUM" in probe["factor W"]


# --- every mode against the single-process reference ------------------------------------------------


def _measured(model, cfg, group) -> tuple:
    """(grad norm, the world's sketch, full gradients, clip coefficient, full gradients after clipping to half)."""
    norm, _ = clip_gradients(model, 0.0)  # 0: measure only
    sketch = GradientSketch(model, cfg.metrics.sketch_dim, cfg.metrics.sketch_seed).partial_sums()
    dist.all_reduce(sketch, group=group)  # the world's sketch: the sum of the ranks' shares (as world_gather)
    # A copy: with one shard per replica (DDP) the full tensor is the local gradient itself, which clipping scales.
    grads = {name: p.grad.full_tensor().clone() for name, p in model.named_parameters()}
    _, coef = clip_gradients(model, norm / 2)
    clipped = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    return norm, sketch.tolist(), grads, coef, clipped


def hsdp_step_one(world_size: int, layouts: list[tuple[int, int, int, tuple[Reduction, ...]]]) -> dict:
    """On every rank, per (dp_replicate, sp, grad_accum, mode): step 1's (loss, reported, norm, sketch, grads,
    clip coefficient, clipped grads)."""
    cfg = run_config(**CFG)
    batch = step_one_batch(cfg)
    results = {}
    for replicas, sp, grad_accum, modes in layouts:
        layout = ParallelLayout(world_size, sp, grad_accum, dp_replicate=replicas)
        meshes = build_meshes(layout, "cpu")
        micro_batches = local_micro_batches(
            batch, dp=layout.dp, dp_rank=meshes.dp_rank, sp=sp, sp_rank=meshes.sp_rank, grad_accum=grad_accum
        )
        for mode in modes:
            model = parallelize(build_model(cfg.model, cfg.seed), meshes, facts(mode).fsdp_reduction)
            reducer = LossReducer(mode, meshes.world_group, grad_accum, sp=sp)
            step = forward_backward(model, micro_batches, reducer, torch.device("cpu"))
            results[replicas, sp, grad_accum, mode] = (
                step.loss,
                step.reported,
                *_measured(model, cfg, meshes.world_group),
            )
    return results


@pytest.fixture(scope="module")
def reference() -> tuple:
    """(loss, grad norm, sketch, gradients) of the whole global batch in one process."""
    cfg = run_config(**CFG)
    batch = step_one_batch(cfg)
    model = build_model(cfg.model, cfg.seed)
    loss = F.cross_entropy(model(batch.inputs).flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    norm = torch.cat([g.flatten() for g in grads.values()]).norm().item()
    sketch = GradientSketch(model, cfg.metrics.sketch_dim, cfg.metrics.sketch_seed).partial_sums().tolist()
    return loss.item(), norm, sketch, grads


ALL_MODES = tuple(BUILT_IN)
THREE = (Reduction.sum, Reduction.local, Reduction.fsdp_sum)
W4_LAYOUTS = [
    (2, 1, 1, ALL_MODES),  # DP(2x2)-SP(1)-GA(1)
    (2, 1, 2, ALL_MODES),  # DP(2x2)-SP(1)-GA(2)
    (4, 1, 2, THREE),  # DP(4x1)-SP(1)-GA(2): plain DDP
    (2, 2, 2, THREE),  # DP(2x1)-SP(2)-GA(2): two replicas of one dp rank, Ulysses inside each
]


@pytest.fixture(scope="module")
def world4() -> dict:
    return run_in_world(hsdp_step_one, 4, 4, W4_LAYOUTS)[0]


def assert_matches(got: tuple, reference: tuple, factor: float, what: str) -> None:
    loss, reported, norm, sketch, grads, coef, clipped = got
    ref_loss, ref_norm, ref_sketch, ref_grads = reference
    assert loss == pytest.approx(ref_loss, rel=1e-5), what
    assert reported == pytest.approx(ref_loss, rel=1e-5), what
    for name, ref_grad in ref_grads.items():
        torch.testing.assert_close(grads[name], ref_grad * factor, msg=lambda m: f"{what} {name}: {m}")
    # The norm over one replica's shards (counted twice, it would be sqrt(R) too big); the sketch counted once.
    assert norm == pytest.approx(ref_norm * factor, rel=1e-5), what
    assert sketch == pytest.approx([value * factor for value in ref_sketch], rel=1e-4, abs=1e-7), what
    # Clipping to half the norm halves every gradient, on every replica alike.
    assert coef == pytest.approx(0.5, rel=1e-5), what
    for name, grad in grads.items():
        torch.testing.assert_close(clipped[name], grad * coef, msg=lambda m: f"{what} clipped {name}: {m}")


@pytest.mark.parametrize("grad_accum", [1, 2], ids=lambda m: f"GA{m}")
@pytest.mark.parametrize("mode", list(FACTOR), ids=lambda m: m.value)
def test_every_mode_keeps_its_factor_at_dp_replicate_2(world4, reference, mode, grad_accum):
    """DP(2x2): sum, fsdp_sum, scaled give grad L; local, detached grad L / 4, as at R = 1."""
    got = world4[2, 1, grad_accum, mode]
    assert_matches(got, reference, FACTOR[mode](4), f"DP(2x2) GA={grad_accum} {mode.value}")


@pytest.mark.parametrize("grad_accum", [1, 2], ids=lambda m: f"GA{m}")
def test_mean_of_means_is_the_same_rule_at_dp_replicate_2(world4, reference, grad_accum):
    """The negative control's rule (each of the dp x M micro-batches' token means, averaged) does not see R."""
    cfg = run_config(**CFG)
    batch = step_one_batch(cfg)
    model = build_model(cfg.model, cfg.seed)
    shards = 4 * grad_accum
    means = [
        F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
        for inputs, labels in zip(batch.inputs.chunk(shards), batch.labels.chunk(shards))
    ]
    torch.stack(means).mean().backward()
    loss, reported, _, _, grads, _, _ = world4[2, 1, grad_accum, Reduction.mean_of_means]
    assert loss == pytest.approx(reference[0], rel=1e-5)  # `loss` is always the true L
    assert reported == pytest.approx(torch.stack(means).mean().item(), rel=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("replicas, sp", [(4, 1), (2, 2)], ids=["DDP DP(4x1)-SP(1)", "HSDP with Ulysses DP(2x1)-SP(2)"])
@pytest.mark.parametrize("mode", THREE, ids=lambda m: m.value)
def test_ddp_and_hsdp_with_sp_keep_the_factors(world4, reference, replicas, sp, mode):
    assert_matches(world4[replicas, sp, 2, mode], reference, FACTOR[mode](4), f"R={replicas} sp={sp} {mode.value}")


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [2, 4], ids=["DP(2x2)-SP(2)", "DP(4x1)-SP(2)"])
@pytest.mark.parametrize("mode", [Reduction.sum, Reduction.local], ids=lambda m: m.value)
def test_w8_oversubscribed_replicas_shards_and_sp(world8, reference, replicas, mode):
    """W = 8 on a machine of fewer cores: all three dims > 1 (2 replicas x 2 shards x sp 2), and DDP with sp."""
    assert_matches(world8[replicas, 2, 2, mode], reference, FACTOR[mode](8), f"W=8 R={replicas} sp=2 {mode.value}")


@pytest.fixture(scope="module")
def world8() -> dict:
    modes = (Reduction.sum, Reduction.local)
    return run_in_world(hsdp_step_one, 8, 8, [(2, 2, 2, modes), (4, 2, 2, modes)], timeout_s=600)[0]


# --- the cost loop, which switches FSDP between mean and sum every arm ------------------------------

COST_RUN = dict(
    world_size=4,
    dp_replicate=2,
    grad_accum=1,
    train__steps=3,
    train__seq_len=32,
    train__global_batch=8,
    optim__name="sgd",  # SGD: a gradient off by a factor moves the weights by it (Adam would hide it)
    optim__lr=0.5,
    optim__clip=0.0,
    metrics__sketch_dim=0,
    wandb__mode="disabled",
)
COST_MODES = ["sum", "local", "fsdp_sum"]


def weights_after(cost_modes: list[str], replicas: int) -> dict[str, torch.Tensor]:
    """On every rank: the full weights after train.steps of `sum`, by the cost loop (its arms interleaved,
    FSDP switched between mean and sum) or by the training loop."""
    from runner.measure.cost import measure_cost
    from runner.train.components import build_parts
    from runner.train.loop import train

    cfg = run_config(**{**COST_RUN, "dp_replicate": replicas}, cost__modes=cost_modes, cost__floor_calls=0)
    parts = build_parts(cfg, build_meshes(ParallelLayout.from_config(cfg), "cpu"), torch.device("cpu"))
    result = (measure_cost if cost_modes else train)(parts, None)
    assert result.status == "completed", result.error
    return {name: p.full_tensor() for name, p in parts.model.named_parameters()}


def cost_and_training_weights() -> dict:
    return {
        "cost DP(2x2)": weights_after(COST_MODES, 2),
        "train DP(2x2)": weights_after([], 2),
        "train DP(4)": weights_after([], 1),
    }


def test_the_cost_loop_trains_sum_as_the_training_loop_does_under_hsdp():
    """Arms in a random order each step (fsdp_sum's forced SUM before sum's mean at steps 2 and 3): the cost loop
    leaves the weights the training loop leaves, at DP(2x2) as at DP(4)."""
    from runner.measure.cost import arm_order

    cfg = run_config(**COST_RUN, cost__modes=COST_MODES)
    orders = [[m.value for m in arm_order(list(cfg.cost.modes), cfg.seed, step)] for step in (1, 2, 3)]
    assert any(order.index("fsdp_sum") < order.index("sum") for order in orders)  # the switch back is exercised
    weights = run_in_world(cost_and_training_weights, 4)[0]
    init = build_model(cfg.model, cfg.seed).state_dict()
    for name, want in weights["train DP(4)"].items():
        assert not torch.equal(want, init[name]), name  # the weights moved
        for run in ("cost DP(2x2)", "train DP(2x2)"):
            torch.testing.assert_close(weights[run][name], want, msg=lambda m: f"{run} {name}: {m}")
