"""Every trainer rule of runner/trainers/ (as its conf/trainer/ preset runs it) in gloo worlds, step 1,
against the single-process reference of its upstream formula (tests/trainer_references.py).

Layouts: W=2 grad_accum=2 on the documents as they are; the same with data.valid_tokens=one_empty (the
last micro-batch of dp rank 1 holds no target); W=4 sp=2 grad_accum=2 with one_empty (both sp shards of
that micro-batch empty). Each rule runs through the runner's own path (build_parts: FSDP's reduction from
custom.fsdp_reduce; the reducer and its hooks from custom.fn; forward_backward), and its full gradient
must be the reference objective's. The runner's `loss` is L whatever the rule; `reported_loss` is what
the rule's trainer logs.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from gloo_world import run_in_world
from helpers import run_config, step_one_batch, step_one_through_parts
from omegaconf import OmegaConf
from trainer_references import RULES, Blocks, objective, token_losses

from runner.layout import ParallelLayout
from runner.model.parallel import build_meshes
from runner.model.registry import build_model

PRESETS = Path(__file__).resolve().parents[1] / "conf" / "trainer"
CFG = dict(train__seq_len=64, train__global_batch=16, seed=3)
LAYOUTS = {
    "W2-GA2": (ParallelLayout(2, 1, 2), "full"),
    "W2-GA2-one_empty": (ParallelLayout(2, 1, 2), "one_empty"),
    "W4-SP2-GA2-one_empty": (ParallelLayout(4, 2, 2), "one_empty"),
}
NAMES = list(RULES)


def preset(name: str) -> dict:
    """custom.fn and custom.fsdp_reduce of conf/trainer/NAME.yaml."""
    custom = OmegaConf.load(PRESETS / f"{name}.yaml").custom
    return {"custom__fn": custom.fn, "custom__fsdp_reduce": custom.fsdp_reduce}


def rule_config(name: str, layout: ParallelLayout, valid_tokens: str):
    return run_config(
        reduction="custom",
        world_size=layout.world_size,
        sp=layout.sp,
        grad_accum=layout.grad_accum,
        data__valid_tokens=valid_tokens,
        **preset(name),
        **CFG,
    )


def rule_gradients(layout: ParallelLayout, valid_tokens: str, names: list[str]) -> dict:
    """On every rank: step 1 of each named rule; rank 0's (loss, reported loss, full gradient) per rule."""
    meshes = build_meshes(layout, "cpu")
    out = {}
    for name in names:
        step, parts = step_one_through_parts(rule_config(name, layout, valid_tokens), meshes)
        grads = {n: p.grad.full_tensor() for n, p in parts.model.named_parameters()}
        out[name] = (step.loss, step.reported, grads)
    return out


@pytest.fixture(scope="module")
def worlds():
    """world(layout_id) -> rank 0's results: one gloo world per layout, started when first asked for."""
    done = {}

    def world(layout_id: str):
        if layout_id not in done:
            layout, valid_tokens = LAYOUTS[layout_id]
            done[layout_id] = run_in_world(rule_gradients, layout.world_size, layout, valid_tokens, NAMES)[0]
        return done[layout_id]

    return world


def reference(layout_id: str, rule: str) -> tuple[Blocks, float, dict]:
    """(blocks, J, dJ) on one process: the rule's upstream formula on the whole step."""
    layout, valid_tokens = LAYOUTS[layout_id]
    cfg = rule_config(rule, layout, valid_tokens)
    batch = step_one_batch(cfg)
    model = build_model(cfg.model, cfg.seed)
    losses, valid = token_losses(model, batch.inputs, batch.labels)
    blocks = Blocks(losses, valid, layout.dp, layout.sp, layout.grad_accum)
    value = objective(blocks, rule)
    value.backward()
    return blocks, value.item(), {n: p.grad for n, p in model.named_parameters()}


CASES = [(layout_id, name) for layout_id in LAYOUTS for name in NAMES]


@pytest.mark.slow
@pytest.mark.parametrize("layout_id, name", CASES, ids=[f"{layout}-{name}" for layout, name in CASES])
def test_each_rule_gives_the_gradient_of_its_upstream_formula(worlds, layout_id, name):
    loss, reported, grads = worlds(layout_id)[name]
    blocks, _, want = reference(layout_id, name)
    assert loss == pytest.approx(blocks.loss.sum().item() / blocks.N, rel=1e-5)  # the runner's L
    for param, grad in want.items():
        assert torch.isfinite(grads[param]).all(), f"{name} {param}: not finite"
        torch.testing.assert_close(grads[param], grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name} {param}: {m}")


def test_the_zero_token_layouts_hold_an_empty_micro_batch_and_unequal_ranks():
    for layout_id in ("W2-GA2-one_empty", "W4-SP2-GA2-one_empty"):
        layout, valid_tokens = LAYOUTS[layout_id]
        batch = step_one_batch(rule_config("torchtitan", layout, valid_tokens))
        b = Blocks(torch.zeros(batch.labels.shape), batch.labels != -100, layout.dp, layout.sp, layout.grad_accum)
        assert b.n(layout.dp - 1, None, layout.grad_accum - 1) == 0  # the last rank's last micro-batch
        assert b.n(0) > 4 * b.n(layout.dp - 1)  # dp rank 0 holds many times dp rank 1's targets


@pytest.mark.slow
@pytest.mark.parametrize("layout_id", list(LAYOUTS))
def test_what_each_trainer_logs_becomes_reported_loss(worlds, layout_id):
    results = worlds(layout_id)
    layout, _ = LAYOUTS[layout_id]
    L = results["torchtitan"][0]
    for name in ("hf_trainer", "xtuner", "megatron", "megatron_default", "torchtitan", "sum_under_fsdp_sum"):
        assert results[name][1] == pytest.approx(L, rel=1e-5), name  # each logs L (its own way)
    # RFC #1335 keeps the engine's mean of a loss that is no longer all-reduced: L / W.
    assert results["xtuner_rfc"][1] == pytest.approx(L / layout.world_size, rel=1e-5)
    no_kwargs = results["hf_trainer_no_loss_kwargs"][1]
    if layout_id.endswith("one_empty"):  # the empty micro-batch's token mean is 0 / 0
        assert math.isnan(no_kwargs)
    else:
        assert math.isfinite(no_kwargs) and no_kwargs != pytest.approx(L, rel=1e-4)
