"""`reduction=custom`: the example trainers and callables written here, step 1 in gloo worlds, against single-process
references.

Each callable runs through the runner's own path (build_parts: FSDP's reduction from `custom.fsdp_reduce`;
the reducer from `custom.fn`). Its gradient must be the one its math gives: dL for the trainers that
normalise by the global count (Hugging Face with average_tokens_across_devices, xtuner as released and as
in PR #1968, torchtitan, Megatron); each dp rank's token mean, averaged, for Hugging Face without it and
for the per-rank-mean bug; 2 dL for a callable that doubles the loss. The runner's `loss` is L whatever
the callable does; `reported_loss` is the callable's logged value, summed over micro-batches and averaged
over ranks.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gloo_world import run_in_world
from helpers import run_config, step_one_batch, step_one_through_parts

from runner.data.batches import IGNORE_INDEX
from runner.layout import ParallelLayout
from runner.model.parallel import build_meshes
from runner.model.registry import build_model

CFG = dict(train__seq_len=64, train__global_batch=12, seed=3)
LAYOUTS = {"W2-GA2": ParallelLayout(2, 1, 2), "W4-SP2": ParallelLayout(4, 2, 2)}
HERE = "tests.test_custom_reductions"


def per_rank_token_mean(logits, labels, ctx):
    """A common bug: each rank normalises by its own valid tokens, FSDP averages the ranks."""
    summed = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum", ignore_index=-100)
    return summed / ctx.rank_tokens


def doubled(logits, labels, ctx):
    """2 W S / N under FSDP's mean: twice grad L; logs its own S / N (summed over micro-batches: this rank's share)."""
    summed = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum", ignore_index=-100)
    local = summed / ctx.global_tokens
    return 2 * ctx.world_size * local, local.detach()


# name: (custom.fn, custom.fsdp_reduce, the expected gradient: "L", "rank means" or a factor of dL)
CALLABLES = {
    "hf_trainer": ("runner.trainers.hf_trainer:loss", "mean", 1.0),
    "hf_trainer_per_device": ("runner.trainers.hf_trainer:loss_per_device", "mean", "rank means"),
    "xtuner": ("runner.trainers.xtuner:released", "mean", 1.0),
    "xtuner_pr1968": ("runner.trainers.xtuner:pr1968", "sum", 1.0),
    "torchtitan": ("runner.trainers.torchtitan:loss", "sum", 1.0),
    "megatron": ("runner.trainers.megatron:per_token", "sum", 1.0),
    "per_rank_token_mean": (f"{HERE}:per_rank_token_mean", "mean", "rank means"),
    "doubled": (f"{HERE}:doubled", "mean", 2.0),
}
# At sp=2 the trainers that normalise by N, and Hugging Face per device (transformers 5 divides its count by the
# context-parallel size with true division: exactly the dp ranks' means).
AT_SP2 = ["hf_trainer", "hf_trainer_per_device", "xtuner", "torchtitan", "megatron"]


def custom_gradients(layout: ParallelLayout, names: list[str]) -> dict:
    """Step-1 (loss, reported loss, full gradient) of each named callable in this world."""
    meshes = build_meshes(layout, "cpu")
    out = {}
    for name in names:
        fn, fsdp_reduce, _ = CALLABLES[name]
        cfg = run_config(
            reduction="custom",
            custom__fn=fn,
            custom__fsdp_reduce=fsdp_reduce,
            world_size=layout.world_size,
            sp=layout.sp,
            grad_accum=layout.grad_accum,
            **CFG,
        )
        step, parts = step_one_through_parts(cfg, meshes)
        grads = {n: p.grad.full_tensor() for n, p in parts.model.named_parameters()}
        out[name] = (step.loss, step.reported, grads)
    return out


def _batch():
    cfg = run_config(**CFG)
    return cfg, step_one_batch(cfg)


def _backward(loss_of) -> tuple[float, dict]:
    cfg, batch = _batch()
    model = build_model(cfg.model, cfg.seed)
    loss = loss_of(model, batch)
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def token_mean():
    """dL: PyTorch's token mean over the whole global batch."""
    return _backward(
        lambda model, b: F.cross_entropy(model(b.inputs).flatten(0, 1), b.labels.flatten(), ignore_index=IGNORE_INDEX)
    )


@pytest.fixture(scope="module")
def rank_means():
    """Each of the dp=2 ranks' token mean over its rows (all its micro-batches), averaged over the ranks."""

    def loss_of(model, b):
        means = [
            F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
            for inputs, labels in zip(b.inputs.chunk(2), b.labels.chunk(2))
        ]
        return torch.stack(means).mean()

    return _backward(loss_of)


def _names(layout_id: str) -> list[str]:
    return list(CALLABLES) if LAYOUTS[layout_id].sp == 1 else AT_SP2


CASES = [(layout_id, name) for layout_id in LAYOUTS for name in _names(layout_id)]


@pytest.fixture(scope="module")
def worlds():
    """world(layout_id) -> (layout, rank 0's results): one gloo world per layout, started when first asked for."""
    done = {}

    def world(layout_id: str):
        layout = LAYOUTS[layout_id]
        if layout_id not in done:
            done[layout_id] = run_in_world(custom_gradients, layout.world_size, layout, _names(layout_id))[0]
        return layout, done[layout_id]

    return world


@pytest.mark.parametrize("layout_id, name", CASES, ids=[f"{layout}-{name}" for layout, name in CASES])
def test_each_callable_gets_the_gradient_its_math_gives(worlds, token_mean, rank_means, layout_id, name):
    _, results = worlds(layout_id)
    expected = CALLABLES[name][2]
    loss, reported, grads = results[name]
    assert loss == pytest.approx(token_mean[0], rel=1e-5)  # the runner's L, whatever the callable does
    want = rank_means[1] if expected == "rank means" else {n: g * expected for n, g in token_mean[1].items()}
    for param, grad in want.items():
        torch.testing.assert_close(grads[param], grad, msg=lambda m: f"{name} {param}: {m}")
    if expected == "rank means":  # not dL up to a scale: the padded documents give the ranks unequal counts
        got = torch.cat([grads[p].flatten() for p in want])
        true = torch.cat([g.flatten() for g in token_mean[1].values()])
        assert torch.nn.functional.cosine_similarity(got, true, dim=0) < 1 - 1e-4


@pytest.mark.parametrize("layout_id", list(LAYOUTS))
def test_logged_values_become_reported_loss(worlds, token_mean, rank_means, layout_id):
    layout, results = worlds(layout_id)
    # Hugging Face logs its backpropagated loss (W S / N): summed over micro-batches, averaged over ranks, L.
    assert results["hf_trainer"][1] == pytest.approx(token_mean[0], rel=1e-5)
    # xtuner logs the all-reduced loss; torchtitan logs nothing of its own (then reported_loss is L).
    assert results["xtuner"][1] == pytest.approx(token_mean[0], rel=1e-5)
    assert results["torchtitan"][1] == results["torchtitan"][0]
    if layout.sp == 1:
        # Without average_tokens_across_devices, each rank's token mean, averaged over ranks.
        assert results["hf_trainer_per_device"][1] == pytest.approx(rank_means[0], rel=1e-5)
        assert results["doubled"][1] == pytest.approx(token_mean[0] / layout.world_size, rel=1e-5)
        assert results["xtuner_pr1968"][1] == pytest.approx(rank_means[0], rel=1e-5)
