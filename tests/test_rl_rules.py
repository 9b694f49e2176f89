"""Every post-training rule (verl, TRL, the papers; conf/trainer/ presets with objective=pg) in gloo worlds,
step 1, against the single-process reference of its formula (tests/rl_references.py).

Layouts: W=2 grad_accum=2 (dp 2) and W=4 sp=2 grad_accum=2 (dp 2, each sequence in two chunks). The step
holds 24 responses in groups of 8, so a prompt's group is cut between dp ranks (rows 8-15) and between
micro-batches; response lengths from 1 to 44 targets of 56 columns, so the sp chunks hold very unequal
counts. Each rule runs through the runner's own path (build_parts: FSDP's reduction from
custom.fsdp_reduce; the reducer and its hooks from custom.fn; forward_backward).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gloo_world import run_in_world
from helpers import run_config, step_one_through_parts
from omegaconf import OmegaConf
from rl_references import REFERENCES, step_from

from runner.layout import ParallelLayout
from runner.model.parallel import build_meshes
from runner.model.registry import build_model
from runner.train.components import global_batches

PRESETS = Path(__file__).resolve().parents[1] / "conf" / "trainer"
OBJECTIVE = dict(
    objective__name="pg",
    objective__group_size=8,
    objective__prompt_len=8,
    objective__min_response=1,
    objective__max_response=44,
    train__seq_len=56,
    train__global_batch=24,
    seed=5,
)
LAYOUTS = {"W2-GA2": ParallelLayout(2, 1, 2), "W4-SP2-GA2": ParallelLayout(4, 2, 2)}
NAMES = list(REFERENCES)


def preset(name: str) -> dict:
    """reduction, custom.fn and custom.fsdp_reduce of conf/trainer/NAME.yaml."""
    loaded = OmegaConf.load(PRESETS / f"{name}.yaml")
    if loaded.reduction != "custom":
        return {"reduction": loaded.reduction}
    return {"reduction": "custom", "custom__fn": loaded.custom.fn, "custom__fsdp_reduce": loaded.custom.fsdp_reduce}


def rule_config(name: str, layout: ParallelLayout):
    return run_config(
        world_size=layout.world_size, sp=layout.sp, grad_accum=layout.grad_accum, **preset(name), **OBJECTIVE
    )


def rule_gradients(layout: ParallelLayout, names: list[str]) -> dict:
    """On every rank: step 1 of each named rule; rank 0's (loss, full gradient) per rule."""
    meshes = build_meshes(layout, "cpu")
    out = {}
    for name in names:
        step, parts = step_one_through_parts(rule_config(name, layout), meshes)
        out[name] = (step.loss, {n: p.grad.full_tensor() for n, p in parts.model.named_parameters()})
    return out


@pytest.fixture(scope="module")
def worlds():
    done = {}

    def world(layout_id: str):
        if layout_id not in done:
            layout = LAYOUTS[layout_id]
            done[layout_id] = run_in_world(rule_gradients, layout.world_size, layout, NAMES)[0]
        return done[layout_id]

    return world


def reference(layout_id: str, name: str) -> tuple[float, float, dict]:
    """(J, the token mean L, dJ) on one process: the rule's formula on the whole step."""
    layout = LAYOUTS[layout_id]
    cfg = rule_config(name, layout)
    model = build_model(cfg.model, cfg.seed)
    step = step_from(model, global_batches(cfg)(1), layout.dp, layout.sp, layout.grad_accum, 44)
    value = REFERENCES[name](step)
    value.backward()
    return value.item(), (step.loss.sum() / step.N).item(), {n: p.grad for n, p in model.named_parameters()}


CASES = [(layout_id, name) for layout_id in LAYOUTS for name in NAMES]


@pytest.mark.slow
@pytest.mark.parametrize("layout_id, name", CASES, ids=[f"{layout}-{name}" for layout, name in CASES])
def test_each_rule_gives_the_gradient_of_its_formula(worlds, layout_id, name):
    loss, grads = worlds(layout_id)[name]
    _, token_mean, want = reference(layout_id, name)
    assert loss == pytest.approx(token_mean, rel=1e-5)  # the runner's L: the token mean of -A log p
    scale = max(float(grad.abs().max()) for grad in want.values())  # token-sum's gradient is N times the mean's
    for param, grad in want.items():
        torch.testing.assert_close(
            grads[param], grad, rtol=1e-4, atol=1e-6 * scale, msg=lambda m: f"{name} {param}: {m}"
        )


def test_the_layouts_cut_groups_and_leave_sp_chunks_unequal():
    cfg = rule_config("reference", LAYOUTS["W4-SP2-GA2"])
    batch = global_batches(cfg)(1)
    groups = batch.responses.group
    assert groups[11] == groups[12]  # rows 0-11 are dp rank 0's, 12-23 dp rank 1's: group 1 spans both
    valid = batch.labels != -100
    first, second = int(valid[:, :28].sum()), int(valid[:, 28:].sum())
    assert first > 1.5 * second > 0  # the chunk with the prompts holds most of the targets
    assert int(batch.responses.length.min()) < 10 and int(batch.responses.length.max()) > 30


def test_rules_that_should_differ_do_differ_from_the_token_mean():
    """The references are not all one objective: the test above could not pass by every rule giving grad L."""
    grads = {}
    for name in ("reference", "trl_grpo", "paper_dapo", "trl_bnpo"):
        _, _, grads[name] = reference("W2-GA2", name)
    base = torch.cat([g.flatten() for g in grads["reference"].values()])
    for name in ("trl_grpo", "paper_dapo", "trl_bnpo"):
        other = torch.cat([g.flatten() for g in grads[name].values()])
        assert torch.nn.functional.cosine_similarity(base, other, dim=0) < 0.9999, name


def rule_messages(layout: ParallelLayout, names: list[str]) -> dict:
    """On every rank: step 1 of each named preset's rule under objective=pg; the CustomRuleError it raised, or ""."""
    from runner.train.custom_rule import CustomRuleError

    meshes = build_meshes(layout, "cpu")
    out = {}
    for name in names:
        try:
            step_one_through_parts(rule_config(name, layout), meshes)
            out[name] = ""
        except CustomRuleError as error:
            out[name] = str(error)
    return out


def test_a_rule_that_reads_no_response_is_stopped_under_objective_pg():
    # xtuner's rule is a cross-entropy of the labels: under objective=pg it would train the responses' likelihood
    # with its advantages unread, while the run's loss logs -A log p. TRL's grpo reads them (the null control).
    messages = run_in_world(rule_messages, 2, LAYOUTS["W2-GA2"], ["xtuner", "trl_grpo"])[0]
    assert messages["trl_grpo"] == ""
    assert messages["xtuner"].startswith("custom.fn=runner.trainers.xtuner:")
    assert (
        "read no response (ctx.responses, ctx.micro_responses) in this step: under objective=pg" in messages["xtuner"]
    )
