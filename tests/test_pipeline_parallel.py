"""Pipeline parallelism (`pp` > 1) composed with FSDP and gradient accumulation, against the single-process
reference.

Real gloo worlds of CPU ranks running the runner's own pieces (`build_meshes`, `DecoderStage`, `parallelize`,
the schedule of `PipelineStep`, the data split, LossReducer, the norm over the stages and the sketch). The
stages of a pipeline hold the same tokens, so each mode keeps the factor of grad L it has without pipelining,
with W the data ranks W / pp (tests/test_gradients.py's FACTOR), and every mode's gradient at
DP(d)-PP(2) is the one at DP(d) without it, mean_of_means included. Then torch's `scale_grads=True`: the
gradient / K per schedule step, which under gradient accumulation divides the earlier micro-batches' share
again (torchtitan #1733). (What a pipeline cannot split is refused before launch: tests/test_pp_rules.py.)
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gloo_world import run_in_world
from helpers import run_config, step_one_batch
from test_gradients import FACTOR
from test_hsdp import CFG, assert_matches
from test_hsdp import reference as reference  # the fixture: the whole global batch in one process

from runner.config import PipelineSchedule
from runner.data.batches import local_micro_batches
from runner.layout import ParallelLayout
from runner.model.parallel import build_meshes, parallelize
from runner.model.pipeline_parallel import DecoderStage, stage_layers
from runner.model.registry import build_model
from runner.modes import BUILT_IN, Reduction, facts
from runner.train.counter import CollectiveCounter
from runner.train.gradients import GradientSketch, clip_gradients
from runner.train.pipeline_step import PipelineStep
from runner.train.reduction import LossReducer, forward_backward, token_loss_sum

ALL_MODES = tuple(BUILT_IN)
GPIPE, ONE_F_ONE_B = PipelineSchedule.gpipe, PipelineSchedule.one_f_one_b
# (pp, grad_accum, schedule, pipeline micro-batches) at W = 4, and the W = 2 layout without pp that has the
# same data split (grad_accum) at W = 2.
W4_LAYOUTS = [(2, 1, GPIPE, 2), (2, 2, ONE_F_ONE_B, 2), (2, 2, GPIPE, 4)]


def _measured(model, cfg, group, norm) -> tuple:
    """(grad norm, the world's sketch, full gradients by name, clip coefficient, clipped gradients) of this rank's
    stage; the norm is `norm` (the pipeline's, over every stage) or DTensor's."""
    grad_norm, _ = clip_gradients(model, 0.0, norm)
    sketch = GradientSketch(model, cfg.metrics.sketch_dim, cfg.metrics.sketch_seed).partial_sums()
    dist.all_reduce(sketch, group=group)  # the world's sketch: every stage's and shard's share
    grads = {name: p.grad.full_tensor().clone() for name, p in model.named_parameters()}
    _, coef = clip_gradients(model, grad_norm / 2, norm)
    clipped = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    return grad_norm, sketch.tolist(), grads, coef, clipped


def pp_step_one(world_size: int, layouts: list, scale_grads: bool = False) -> dict:
    """On every rank, per (pp, grad_accum, schedule, micro-batches, mode): step 1's (loss, reported, norm,
    sketch, this stage's grads, clip coefficient, clipped grads), and which collectives ran."""
    results = {}
    for pp, grad_accum, schedule, microbatches in layouts:
        cfg = run_config(
            **CFG,
            world_size=world_size,
            grad_accum=grad_accum,
            pp=pp,
            pp_schedule=schedule.value,
            pp_microbatches=microbatches,
            pp_scale_grads=scale_grads,
        )
        layout = ParallelLayout(world_size, 1, grad_accum, pp=pp)
        meshes = build_meshes(layout, "cpu")
        micro_batches = local_micro_batches(
            step_one_batch(cfg), dp=layout.dp, dp_rank=meshes.dp_rank, sp=1, sp_rank=0, grad_accum=grad_accum
        )
        for mode in ALL_MODES:
            stage = DecoderStage(build_model(cfg.model, cfg.seed), meshes.pp.get_local_rank(), pp)
            model = parallelize(stage, meshes, facts(mode).fsdp_reduction)
            pipeline = PipelineStep(model, meshes, cfg, torch.device("cpu"))
            reducer = LossReducer(mode, meshes.loss_group, grad_accum)
            counter = CollectiveCounter(meshes.group_kinds())
            with counter:
                step = pipeline.forward_backward(micro_batches, reducer)
            calls = {kind: c["calls"] for kind, c in counter.take().items()}
            key = (pp, grad_accum, schedule, microbatches, mode)
            results[key] = (step.loss, step.reported, *_measured(model, cfg, meshes.world_group, pipeline.grad_norm))
            results[("calls", *key)] = calls
    results["data ranks"] = dist.get_world_size(meshes.loss_group)
    return results


def plain_step_one(world_size: int, grad_accums: list[int]) -> dict:
    """The same at W = world_size without pipelining, for the modes' gradients to compare."""
    cfg = run_config(**CFG)
    results = {}
    for grad_accum in grad_accums:
        layout = ParallelLayout(world_size, 1, grad_accum)
        meshes = build_meshes(layout, "cpu")
        micro_batches = local_micro_batches(
            step_one_batch(cfg), dp=layout.dp, dp_rank=meshes.dp_rank, sp=1, sp_rank=0, grad_accum=grad_accum
        )
        for mode in ALL_MODES:
            model = parallelize(build_model(cfg.model, cfg.seed), meshes, facts(mode).fsdp_reduction)
            reducer = LossReducer(mode, meshes.loss_group, grad_accum)
            step = forward_backward(model, micro_batches, reducer, torch.device("cpu"))
            results[grad_accum, mode] = (step.loss, step.reported, *_measured(model, cfg, meshes.world_group, None))
    return results


def _stages_together(results: list[dict], key) -> tuple:
    """One rank per stage of a pipeline (ranks 0 and W - 1 lie on stages 0 and P - 1 of dp rank 0 and
    dp - 1: each stage's full gradients are the same on all its data ranks): the whole model's gradients."""
    first, last = results[0][key], results[-1][key]
    assert first[:4] == last[:4], "the stages' loss, reported loss, norm and sketch differ"
    return (*first[:4], {**first[4], **last[4]}, first[5], {**first[6], **last[6]})


@pytest.fixture(scope="module")
def world4() -> list[dict]:
    return run_in_world(pp_step_one, 4, 4, W4_LAYOUTS)


@pytest.fixture(scope="module")
def world2() -> dict:
    return run_in_world(plain_step_one, 2, 2, [1, 2])[0]


def _name(layout) -> str:
    pp, grad_accum, schedule, microbatches = layout
    return f"{ParallelLayout(4, 1, grad_accum, pp=pp)}-{schedule.value}-K{microbatches}"


def test_the_stages_split_the_layers_evenly_and_keep_their_names():
    assert [list(stage_layers(5, 2, s)) for s in range(2)] == [[0, 1, 2], [3, 4]]
    assert [list(stage_layers(4, 4, s)) for s in range(4)] == [[0], [1], [2], [3]]
    cfg = run_config(**CFG, model__n_layers=3)
    model = build_model(cfg.model, cfg.seed)
    stages = [DecoderStage(model, s, 2) for s in range(2)]
    names = [name for stage in stages for name, _ in stage.named_parameters()]
    assert sorted(names) == sorted(name for name, _ in model.named_parameters())  # each once, by its own name
    tokens = step_one_batch(cfg).inputs[:2]
    torch.testing.assert_close(stages[1](stages[0](tokens)), model(tokens))


def test_fsdp_shards_each_stage_over_the_data_ranks_of_its_pipeline(world4):
    assert world4[0]["data ranks"] == 2


@pytest.mark.parametrize("layout", W4_LAYOUTS, ids=_name)
@pytest.mark.parametrize("mode", list(FACTOR), ids=lambda m: m.value)
def test_every_mode_keeps_its_factor_with_w_the_data_ranks(world4, reference, mode, layout):
    """sum, fsdp_sum, scaled: grad L; local, detached: grad L / (W / pp) = grad L / 2, not / 4; the norm over
    every stage, the sketch and clipping of the whole model."""
    got = _stages_together(world4, (*layout, mode))
    assert_matches(got, reference, FACTOR[mode](2), f"{_name(layout)} {mode.value}")


@pytest.mark.parametrize("layout", W4_LAYOUTS, ids=_name)
@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.value)
def test_pipelining_leaves_every_modes_gradient_as_without_it(world4, world2, mode, layout):
    """DP(2)-PP(2) at W = 4 against DP(2) at W = 2, GPipe and 1F1B, K = 2 or 4 pipeline micro-batches: the same
    loss, reported loss, norm and gradient for every mode, mean_of_means included."""
    with_pp, without = _stages_together(world4, (*layout, mode)), world2[layout[1], mode]
    assert with_pp[0] == pytest.approx(without[0], rel=1e-6)  # L
    assert with_pp[1] == pytest.approx(without[1], rel=1e-6)  # what the mode reports
    assert with_pp[2] == pytest.approx(without[2], rel=1e-5)  # the grad norm over every stage
    for name, grad in without[4].items():
        torch.testing.assert_close(with_pp[4][name], grad, rtol=1e-5, atol=1e-7, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("layout", W4_LAYOUTS, ids=_name)
@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.value)
def test_pp_collectives_are_counted_apart_and_the_loss_ones_run_on_the_last_stage(world4, mode, layout):
    """The stages' activations and gradients are sends and receives on the pipeline's group: one of each per
    pipeline micro-batch k and micro-batch m, and torch's warm-up exchange on a schedule's first step. The
    loss's all-reduces (`all_reduce`): N on every stage; the mode's own on the last stage only, sum's forward
    and backward per k (2KM, where the same split without pp has 2M), detached's per k, the others' one per
    step on each stage (its loss there is zero). The last stage's loss reaches the others in one
    `pp_all_reduce`."""
    _, grad_accum, _, microbatches = layout
    first, last = world4[0][("calls", *layout, mode)], world4[-1][("calls", *layout, mode)]
    pieces = grad_accum * microbatches
    for calls in (first, last):
        assert calls["pp_send"] == calls["pp_recv"] == pieces + 1, calls  # stage 0 sends activations, 1 gradients
        assert calls["pp_all_reduce"] == 1, calls
    own_on_last = {Reduction.sum: 2 * pieces, Reduction.detached: pieces}.get(mode, 1)
    own_on_first = 0 if mode in (Reduction.sum, Reduction.detached) else 1
    assert last["all_reduce"] == 1 + own_on_last, last
    assert first["all_reduce"] == 1 + own_on_first, first


def _micro_batch_gradients(grad_accum: int) -> list[dict[str, torch.Tensor]]:
    """In one process: g_m = grad (S_m / N) of each micro-batch m of the whole batch (dp = 1)."""
    cfg = run_config(**CFG)
    micro_batches = local_micro_batches(step_one_batch(cfg), dp=1, dp_rank=0, sp=1, sp_rank=0, grad_accum=grad_accum)
    valid = sum(micro.valid_tokens for micro in micro_batches)
    gradients = []
    for micro in micro_batches:
        model = build_model(cfg.model, cfg.seed)
        (token_loss_sum(model(micro.inputs), micro.labels) / valid).backward()
        gradients.append({name: p.grad for name, p in model.named_parameters()})
    return gradients


@pytest.mark.parametrize("grad_accum", [1, 2], ids=lambda m: f"GA{m}")
def test_scale_grads_divides_every_schedule_step_and_the_accumulated_gradient_again(grad_accum):
    """torch's scale_grads=True with K = 2 pipeline micro-batches, mode local at DP(1)-PP(2): grad L / K at GA 1
    (g_1 / 2); at GA 2 the first micro-batch's gradient is divided by K at both steps, (g_1 / K + g_2) / K =
    g_1 / 4 + g_2 / 2 rather than (g_1 + g_2) / K: the moving average of torchtitan #1733. The loss does not
    show it."""
    layout = (2, grad_accum, GPIPE, 2)
    scaled = _stages_together(run_in_world(pp_step_one, 2, 2, [layout], True), (*layout, Reduction.local))
    unscaled = _stages_together(run_in_world(pp_step_one, 2, 2, [layout], False), (*layout, Reduction.local))
    g = _micro_batch_gradients(grad_accum)
    weights = [0.5] if grad_accum == 1 else [0.25, 0.5]
    assert scaled[0] == pytest.approx(unscaled[0], rel=1e-6)
    for name, right in unscaled[4].items():
        torch.testing.assert_close(right, sum(part[name] for part in g), msg=lambda m: f"{name} unscaled: {m}")
        expected = sum(w * part[name] for w, part in zip(weights, g))
        torch.testing.assert_close(scaled[4][name], expected, msg=lambda m: f"{name} scaled: {m}")
