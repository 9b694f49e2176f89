"""Step-1 loss and full gradient of every reduction mode against a single-process reference.

Each world is a real gloo process group of W CPU ranks running the runner's own
pieces (data split, FSDP2 sharding, LossReducer, forward_backward). The
reference trains the same seed-initialised model on the whole global batch in
one process with PyTorch's token-mean cross-entropy: the gradient of L.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gloo_world import run_in_world
from helpers import run_config, step_one_batch

from runner.data.batches import IGNORE_INDEX, local_micro_batches
from runner.layout import ParallelLayout
from runner.model.parallel import build_meshes, parallelize
from runner.model.registry import build_model
from runner.modes import BUILT_IN, Reduction, facts
from runner.train.reduction import LossReducer, forward_backward

WORLD_SIZES = (2, 4)
GRAD_ACCUMS = (1, 3)
CFG = dict(train__seq_len=64, train__global_batch=12, seed=3)  # 12 splits over every W * grad_accum here
# The gradient each mode should produce, as a multiple of the reference gradient dL.
FACTOR = {
    Reduction.sum: lambda w: 1.0,
    Reduction.fsdp_sum: lambda w: 1.0,
    Reduction.scaled: lambda w: 1.0,
    Reduction.local: lambda w: 1.0 / w,
    Reduction.detached: lambda w: 1.0 / w,
}


def world_gradients(world_size: int) -> dict:
    """On every rank: each mode's step-1 (loss, reported loss, full gradient) for each grad_accum."""
    cfg = run_config(**CFG)
    meshes = build_meshes(ParallelLayout(world_size, 1, 1), "cpu")
    batch = step_one_batch(cfg)
    results = {}
    for grad_accum in GRAD_ACCUMS:
        micro_batches = local_micro_batches(
            batch, dp=world_size, dp_rank=meshes.dp_rank, sp=1, sp_rank=0, grad_accum=grad_accum
        )
        for mode in BUILT_IN:
            model = parallelize(build_model(cfg.model, cfg.seed), meshes, facts(mode).fsdp_reduction)
            step = forward_backward(
                model, micro_batches, LossReducer(mode, meshes.world_group, grad_accum), torch.device("cpu")
            )
            grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
            results[grad_accum, mode] = (step.loss, step.reported, grads)
    return results


@pytest.fixture(scope="module")
def reference():
    cfg = run_config(**CFG)
    batch = step_one_batch(cfg)
    model = build_model(cfg.model, cfg.seed)
    logits = model(batch.inputs)
    loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX)  # token mean
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda w: f"W{w}")
def world(request):
    results = run_in_world(world_gradients, request.param, request.param)
    return request.param, results[0]


@pytest.mark.parametrize("grad_accum", GRAD_ACCUMS, ids=lambda m: f"M{m}")
@pytest.mark.parametrize("mode", list(FACTOR), ids=lambda m: m.value)
def test_correct_modes_match_reference(world, reference, mode, grad_accum):
    world_size, results = world
    ref_loss, ref_grads = reference
    loss, reported, grads = results[grad_accum, mode]
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert reported == pytest.approx(ref_loss, rel=1e-6)
    factor = FACTOR[mode](world_size)
    for name, ref_grad in ref_grads.items():
        torch.testing.assert_close(grads[name], ref_grad * factor, msg=lambda m: f"{mode.value} {name}: {m}")


@pytest.mark.parametrize("grad_accum", GRAD_ACCUMS, ids=lambda m: f"M{m}")
def test_mean_of_means_is_flagged_by_its_mismatch(world, reference, grad_accum):
    """The negative control: with unequal token counts, mean-of-means is not the token mean."""
    _, results = world
    ref_loss, ref_grads = reference
    loss, reported, grads = results[grad_accum, Reduction.mean_of_means]
    assert loss == pytest.approx(ref_loss, rel=1e-6)  # `loss` is always the true L
    assert abs(reported - ref_loss) / ref_loss > 1e-4  # far above float noise (~1e-7)
    got = torch.cat([grads[name].flatten() for name in ref_grads])
    want = torch.cat([grad.flatten() for grad in ref_grads.values()])
    # Not even a rescaling of dL: the residual after the best scalar fit stays large.
    best_scale = got.dot(want) / got.dot(got)
    assert ((best_scale * got - want).norm() / want.norm()).item() > 0.02


def test_world_sizes_agree_on_local_step_loss(world, reference):
    """`local` logs the same L whatever the split: its loss is reduced once per step."""
    _, results = world
    losses = {results[m, Reduction.local][0] for m in GRAD_ACCUMS}
    assert max(losses) - min(losses) < 1e-6 * reference[0]


SP_DEGREES = (1, 2, 4)
SP_MODES = (Reduction.sum, Reduction.local, Reduction.mean_of_means)


def world_sp_gradients(world_size: int) -> dict:
    """At W = world_size, for each sp: step-1 (loss, full gradient) of `sum` and `local`."""
    cfg = run_config(**CFG)
    batch = step_one_batch(cfg)
    results = {}
    for sp in SP_DEGREES:
        layout = ParallelLayout(world_size, sp, 1)
        meshes = build_meshes(layout, "cpu")
        micro_batches = local_micro_batches(
            batch, dp=layout.dp, dp_rank=meshes.dp_rank, sp=sp, sp_rank=meshes.sp_rank, grad_accum=1
        )
        for mode in SP_MODES:
            model = parallelize(build_model(cfg.model, cfg.seed), meshes, facts(mode).fsdp_reduction)
            reducer = LossReducer(mode, meshes.world_group, 1, sp=sp)
            step = forward_backward(model, micro_batches, reducer, torch.device("cpu"))
            results[sp, mode] = (
                step.loss,
                step.reported,
                {name: p.grad.full_tensor() for name, p in model.named_parameters()},
            )
    return results


@pytest.fixture(scope="module")
def sp_world():
    return run_in_world(world_sp_gradients, 4, 4)[0]


@pytest.mark.parametrize("sp", SP_DEGREES, ids=lambda s: f"sp{s}")
@pytest.mark.parametrize("mode", SP_MODES[:2], ids=lambda m: m.value)
def test_sequence_parallel_gradients_match_reference(sp_world, reference, sp, mode):
    """W = 4 = dp * sp: `sum` gives dL and `local` dL / 4 whatever the split into dp and sp."""
    ref_loss, ref_grads = reference
    loss, _, grads = sp_world[sp, mode]
    assert loss == pytest.approx(sp_world[1, mode][0], rel=1e-5)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    factor = FACTOR[mode](4)
    for name, ref_grad in ref_grads.items():
        torch.testing.assert_close(grads[name], ref_grad * factor, msg=lambda m: f"sp={sp} {mode.value} {name}: {m}")


def mean_of_means_reference(dp: int, grad_accum: int) -> tuple[float, dict]:
    """The whole-sequence rule in one process: each micro-batch's token mean, averaged over the dp * M of them."""
    cfg = run_config(**CFG)
    batch = step_one_batch(cfg)
    model = build_model(cfg.model, cfg.seed)
    shards = dp * grad_accum
    means = [
        F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
        for inputs, labels in zip(batch.inputs.chunk(shards), batch.labels.chunk(shards))
    ]
    loss = torch.stack(means).mean()
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("sp", SP_DEGREES, ids=lambda s: f"sp{s}")
def test_mean_of_means_under_sp_is_the_whole_sequence_rule(sp_world, reference, sp):
    """sp chunks of one micro-batch share its whole-sequence token count: the rule does not depend on sp."""
    dp = 4 // sp
    want_loss, want_grads = mean_of_means_reference(dp, 1)
    loss, reported, grads = sp_world[sp, Reduction.mean_of_means]
    assert loss == pytest.approx(reference[0], rel=1e-5)  # `loss` is always the true L
    assert reported == pytest.approx(want_loss, rel=1e-5)
    for name, want in want_grads.items():
        torch.testing.assert_close(grads[name], want, msg=lambda m: f"sp={sp} {name}: {m}")
    if dp > 1:  # unequal counts over the dp micro-batches: not the token mean
        assert abs(reported - reference[0]) / reference[0] > 1e-4
