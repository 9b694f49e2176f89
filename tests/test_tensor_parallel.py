"""Tensor parallelism (`tp` > 1) composed with FSDP and Ulysses, against the single-process reference.

Real gloo worlds of CPU ranks running the runner's own pieces (`build_meshes`, `parallelize` with
torchtitan's plan, the data split, LossReducer, forward_backward, the grad norm, clipping and the sketch).
The tp ranks of a group hold the same tokens, so each mode keeps the factor of grad L it has at tp = 1 with W
replaced by the data ranks W / tp (tests/test_gradients.py's FACTOR), and the gradient at DP(d)-SP(s)-TP(t) is
the one at DP(d)-SP(s) without tensor parallelism, mean_of_means included. Then the bug class the issue names:
the token count, or the loss's all-reduce, taken over all W ranks instead of the data ranks. (What tp cannot
split is refused before launch: tests/test_tp_rules.py.)
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gloo_world import run_in_world
from helpers import run_config, step_one_batch
from test_gradients import FACTOR
from test_hsdp import CFG, _measured, assert_matches
from test_hsdp import reference as reference  # the fixture: the whole global batch in one process
from torch.distributed.tensor import DTensor

from runner.data.batches import local_micro_batches
from runner.layout import ParallelLayout
from runner.model.parallel import build_meshes, parallelize
from runner.model.registry import build_model
from runner.modes import BUILT_IN, Reduction, facts
from runner.train.counter import CollectiveCounter
from runner.train.reduction import LossReducer, forward_backward, global_valid_tokens

ALL_MODES = tuple(BUILT_IN)
# (sp, tp, grad_accum) at W = 4, and the W = 2 layout without tp that has the same data split.
W4_LAYOUTS = [(1, 2, 1), (1, 2, 2), (2, 2, 1)]
SAME_SPLIT_W2 = {(1, 2, 1): (1, 1), (1, 2, 2): (1, 2), (2, 2, 1): (2, 1)}  # -> (sp, grad_accum) at W = 2


def _micro_batches(cfg, layout: ParallelLayout, meshes):
    return local_micro_batches(
        step_one_batch(cfg),
        dp=layout.dp,
        dp_rank=meshes.dp_rank,
        sp=layout.sp,
        sp_rank=meshes.sp_rank,
        grad_accum=layout.grad_accum,
    )


def tp_step_one(
    world_size: int, layouts: list[tuple[int, int, int]], loss_parallel: bool = False, dp_replicate: int = 1
) -> dict:
    """On every rank, per (sp, tp, grad_accum, mode): step 1's (loss, reported, norm, sketch, grads, clip
    coefficient, clipped grads), and for tp > 1 what the parameters are and which collectives ran; with
    `loss_parallel` the loss on the logits sharded over the vocabulary (torch's vocab-parallel cross entropy)."""
    cfg = run_config(**CFG)
    results = {}
    for sp, tp, grad_accum in layouts:
        layout = ParallelLayout(world_size, sp, grad_accum, dp_replicate=dp_replicate, tp=tp)
        meshes = build_meshes(layout, "cpu")
        micro_batches = _micro_batches(cfg, layout, meshes)
        for mode in ALL_MODES:
            model = build_model(cfg.model, cfg.seed)
            model = parallelize(model, meshes, facts(mode).fsdp_reduction, loss_parallel=loss_parallel)
            reducer = LossReducer(mode, meshes.loss_group, grad_accum, sp=sp)
            counter = CollectiveCounter(meshes.group_kinds())
            with counter:
                step = forward_backward(model, micro_batches, reducer, torch.device("cpu"))
            calls = {kind: c["calls"] for kind, c in counter.take().items()}
            results[sp, tp, grad_accum, mode] = (step.loss, step.reported, *_measured(model, cfg, meshes.world_group))
            results["calls", sp, tp, grad_accum, mode] = calls
        if tp > 1:
            results["meshes", sp, tp, grad_accum] = {
                "data ranks": dist.get_world_size(meshes.loss_group),
                "tp ranks": meshes.tp.size(),
                "mesh dims": sorted(
                    {p.device_mesh.mesh_dim_names for p in model.parameters() if isinstance(p, DTensor)}
                ),
            }
    return results


def wrong_group(world_size: int) -> dict:
    """DP(2)-SP(1)-TP(2), mode sum: the count N over all W ranks (each token counted tp times), the loss's
    all-reduce over all W ranks, or both; the full gradients of each, and the losses they report."""
    cfg = run_config(**CFG)
    layout = ParallelLayout(world_size, 1, 1, tp=2)
    meshes = build_meshes(layout, "cpu")
    micro_batches = _micro_batches(cfg, layout, meshes)
    out = {}
    for name, count_group, loss_group in (
        ("count over W", meshes.world_group, meshes.loss_group),
        ("all-reduce over W", meshes.loss_group, meshes.world_group),
        ("both over W", meshes.world_group, meshes.world_group),
    ):
        model = parallelize(build_model(cfg.model, cfg.seed), meshes, "mean")
        reducer = LossReducer(Reduction.sum, loss_group, 1)
        reducer.start_step(global_valid_tokens(micro_batches, count_group, torch.device("cpu")))
        for micro in micro_batches:
            logits = model(micro.inputs, position_offset=micro.position_offset)
            reducer.micro_batch_loss(logits, micro.labels, micro).backward()
        step = reducer.finish_step()
        out[name] = (step.loss, step.valid_tokens, {n: p.grad.full_tensor() for n, p in model.named_parameters()})
    return out


def _worlds(world_size: int, layouts: list[tuple[int, int, int]], loss_parallel: bool = False) -> dict:
    """One world per layout, as the runner builds one mesh per process: torch reuses the groups of an earlier
    mesh of the same shape for the DTensors of a later one, so a second mesh's collectives would be counted
    under the first mesh's group names."""
    results = {}
    for layout in layouts:
        results.update(run_in_world(tp_step_one, world_size, world_size, [layout], loss_parallel)[0])
    return results


@pytest.fixture(scope="module")
def world4() -> dict:
    return _worlds(4, W4_LAYOUTS)


@pytest.fixture(scope="module")
def world4_loss_parallel() -> dict:
    return _worlds(4, W4_LAYOUTS, loss_parallel=True)


@pytest.fixture(scope="module")
def world2() -> dict:
    return _worlds(2, [(sp, 1, ga) for sp, ga in SAME_SPLIT_W2.values()])


def test_tp_shards_every_parameter_over_the_data_and_tp_ranks(world4):
    for sp, tp, grad_accum in W4_LAYOUTS:
        got = world4["meshes", sp, tp, grad_accum]
        assert got["data ranks"] == 4 // tp and got["tp ranks"] == tp
        # FSDP over the flattened data ranks and the tp plan over tp: one 2-D mesh for every parameter (the
        # norms too, replicated over tp), so DTensor's norm and the sketch see one consistent mesh.
        assert got["mesh dims"] == [("dp_sp", "tp")]


@pytest.mark.parametrize("layout", W4_LAYOUTS, ids=lambda s: str(ParallelLayout(4, s[0], s[2], tp=s[1])))
@pytest.mark.parametrize("mode", list(FACTOR), ids=lambda m: m.value)
def test_every_mode_keeps_its_factor_with_w_the_data_ranks(world4, reference, mode, layout):
    """sum, fsdp_sum, scaled: grad L; local, detached: grad L / (W / tp) = grad L / 2, not / 4."""
    sp, tp, grad_accum = layout
    got = world4[sp, tp, grad_accum, mode]
    assert_matches(got, reference, FACTOR[mode](4 // tp), f"{ParallelLayout(4, sp, grad_accum, tp=tp)} {mode.value}")


@pytest.mark.parametrize("layout", W4_LAYOUTS, ids=lambda s: str(ParallelLayout(4, s[0], s[2], tp=s[1])))
@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.value)
def test_tensor_parallelism_leaves_every_modes_gradient_as_without_it(world4, world2, mode, layout):
    """DP(d)-SP(s)-TP(2) at W = 4 against DP(d)-SP(s) at W = 2: the same loss, norm and gradient for every mode,
    mean_of_means (whose weights depend on the data split only) included."""
    sp, tp, grad_accum = layout
    with_tp, without = world4[sp, tp, grad_accum, mode], world2[sp, 1, grad_accum, mode]
    assert with_tp[0] == pytest.approx(without[0], rel=1e-6)  # L
    assert with_tp[1] == pytest.approx(without[1], rel=1e-6)  # what the mode reports
    assert with_tp[2] == pytest.approx(without[2], rel=1e-5)  # the grad norm
    for name, grad in without[4].items():
        torch.testing.assert_close(with_tp[4][name], grad, rtol=1e-5, atol=1e-7, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("layout", W4_LAYOUTS, ids=lambda s: str(ParallelLayout(4, s[0], s[2], tp=s[1])))
@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.value)
def test_the_vocab_parallel_loss_gives_every_mode_the_gathered_logits_gradient(
    world4, world4_loss_parallel, reference, mode, layout
):
    """loss_parallel: torch's cross entropy on the logits sharded over the vocabulary, never gathered: the same
    loss, norm and gradient as on the gathered logits, and so each mode's factor of grad L."""
    sp, tp, grad_accum = layout
    parallel, gathered = world4_loss_parallel[sp, tp, grad_accum, mode], world4[sp, tp, grad_accum, mode]
    assert parallel[:3] == pytest.approx(gathered[:3], rel=1e-6)  # L, what the mode reports, the grad norm
    for name, grad in gathered[4].items():
        torch.testing.assert_close(parallel[4][name], grad, rtol=1e-5, atol=1e-7, msg=lambda m: f"{name}: {m}")
    if mode in FACTOR:
        assert_matches(parallel, reference, FACTOR[mode](4 // tp), f"loss_parallel {mode.value}")
    # The logits are never gathered: one all-gather fewer per micro-batch on the tp group.
    calls = world4_loss_parallel["calls", sp, tp, grad_accum, mode]
    assert calls["tp_all_gather"] == world4["calls", sp, tp, grad_accum, mode]["tp_all_gather"] - grad_accum


@pytest.mark.parametrize("layout", W4_LAYOUTS, ids=lambda s: str(ParallelLayout(4, s[0], s[2], tp=s[1])))
@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.value)
def test_tp_collectives_are_counted_apart_and_the_loss_ones_are_as_without_tp(world4, world2, mode, layout):
    sp, tp, grad_accum = layout
    calls, without = world4["calls", sp, tp, grad_accum, mode], world2["calls", sp, 1, grad_accum, mode]
    assert calls.get("all_reduce") == without.get("all_reduce"), (calls, without)  # N and the mode's own
    assert calls["tp_all_gather"] > 0 and calls["tp_reduce_scatter"] > 0


@pytest.mark.slow
def test_hsdp_with_tp_keeps_every_modes_factor_and_counts_the_replicas_apart(reference):
    """DP(2x2)-SP(1)-TP(2) at W = 8: FSDP's 2-D (replicate, shard) mesh over the 4 data ranks, tp inside each."""
    world = run_in_world(tp_step_one, 8, 8, [(1, 2, 1)], False, 2)[0]
    assert world["meshes", 1, 2, 1]["mesh dims"] == [("replicate", "shard_sp", "tp")]
    for mode in FACTOR:
        assert_matches(world[1, 2, 1, mode], reference, FACTOR[mode](4), f"DP(2x2)-SP(1)-TP(2) {mode.value}")
        calls = world["calls", 1, 2, 1, mode]
        assert calls["replica_all_reduce"] > 0 and calls["tp_all_gather"] > 0
        assert calls["all_reduce"] == (3 if mode is Reduction.sum else 2)  # N and the mode's own, GA 1


@pytest.fixture(scope="module")
def wrong() -> dict:
    return run_in_world(wrong_group, 4, 4)[0]


def test_a_count_over_the_tp_ranks_divides_the_gradient_by_tp(wrong, reference):
    """N counts each token tp times: the loss is L / tp and the gradient grad L / tp."""
    loss, valid_tokens, grads = wrong["count over W"]
    ref_loss, _, _, ref_grads = reference
    assert valid_tokens == 2 * int(step_one_batch(run_config(**CFG)).valid_tokens)  # every token twice
    assert loss == pytest.approx(ref_loss / 2, rel=1e-5)
    for name, ref_grad in ref_grads.items():
        torch.testing.assert_close(grads[name], ref_grad / 2, msg=lambda m: f"{name}: {m}")


def test_a_loss_all_reduce_over_the_tp_ranks_multiplies_the_gradient_by_tp(wrong, reference):
    """Summed over all W ranks, each group's L_rsm is added tp times (L x tp), and the backward's SUM seeds each
    rank with W = tp x (W / tp): after FSDP's mean over the W / tp data ranks, tp x grad L."""
    loss, _, grads = wrong["all-reduce over W"]
    ref_loss, _, _, ref_grads = reference
    assert loss == pytest.approx(ref_loss * 2, rel=1e-5)
    for name, ref_grad in ref_grads.items():
        torch.testing.assert_close(grads[name], ref_grad * 2, msg=lambda m: f"{name}: {m}")


def test_the_count_and_the_all_reduce_both_over_the_tp_ranks_cancel(wrong, reference):
    """N x tp and the all-reduce's x tp cancel: the loss is L and the gradient grad L, so neither the logged loss
    nor the gradient shows two wrong groups taken together."""
    loss, valid_tokens, grads = wrong["both over W"]
    ref_loss, _, _, ref_grads = reference
    assert valid_tokens == 2 * int(step_one_batch(run_config(**CFG)).valid_tokens)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    for name, ref_grad in ref_grads.items():
        torch.testing.assert_close(grads[name], ref_grad, msg=lambda m: f"{name}: {m}")
