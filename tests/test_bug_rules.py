"""Every known bug's arms (conf/bug/NAME.yaml: the buggy arm, the upstream logic before the fix, and the fixed
arm), run as the bug's config runs them in a gloo world at the bug's layout, step 1, against the single-process
reference of the arm's formula (tests/bug_references.py), generated over conf/bug/.

And the bug shows there: the fixed arm's gradient is grad L (the gradient of the step's token-mean loss), the
buggy arm's is the stated factor times it, or (stated `different`) another direction. A bug of the grad norm
alone (`known_bug.buggy.grad_norm`): the buggy arm's gradient is grad L itself, its grad norm (the one the runner
logs and clips with: the rule's `grad_norm` hook) the stated factor times ||grad L||, and its clipping factor
(optim.clip binds) that factor smaller. Every other arm's grad norm is its own gradient's norm.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from bug_references import ARMS, arm_objective
from gloo_world import run_in_world
from helpers import run_config, step_one_batch, step_one_through_parts
from omegaconf import OmegaConf
from trainer_references import Blocks, token_losses

from runner.config import Evidence
from runner.layout import ParallelLayout
from runner.model.parallel import build_meshes
from runner.model.registry import build_model
from runner.modes import custom_expectation, grad_norm_factor
from runner.train.gradients import clip_gradients

BUGS = sorted(path.stem for path in (Path(__file__).resolve().parents[1] / "conf" / "bug").glob("*.yaml"))
SMALL = dict(train__seq_len=64, train__global_batch=16, seed=3)


def bug_file(name: str):
    return OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "bug" / f"{name}.yaml")


def arm_config(name: str, arm: str):
    bug = bug_file(name)
    data = bug.get("data", {})
    return run_config(
        reduction="custom",
        world_size=bug.world_size,
        sp=bug.sp,
        grad_accum=bug.grad_accum,
        dp_replicate=bug.get("dp_replicate", 1),
        data__valid_tokens=data.get("valid_tokens", "full"),
        data__packing=data.get("packing", False),
        custom__fn=bug.known_bug[arm].fn,
        custom__fsdp_reduce=bug.known_bug[arm].fsdp_reduce,
        **{f"optim__{key}": value for key, value in bug.get("optim", {}).items()},
        **SMALL,
    )


def layout_of(cfg) -> ParallelLayout:
    return ParallelLayout.from_config(cfg)


def arm_gradients(name: str) -> dict:
    """On every rank: step 1 of both arms; rank 0's full gradient per arm, and its (grad norm, clip factor) as
    the runner takes them (the rule's `grad_norm` hook where it has one) with the bug's optim.clip."""
    meshes = build_meshes(layout_of(arm_config(name, "buggy")), "cpu")
    out = {}
    for arm in ("buggy", "fixed"):
        cfg = arm_config(name, arm)
        _, parts, reducer = step_one_through_parts(cfg, meshes, with_reducer=True)
        out[arm] = {
            n: p.grad.full_tensor().clone() for n, p in parts.model.named_parameters()
        }  # clipping scales in place
        out[f"{arm} norm"] = clip_gradients(parts.model, cfg.optim.clip, reducer.grad_norm())
    return out


def reference(name: str, arm: str | None) -> dict:
    """The arm's objective's gradient on one process (None: grad L, the step's token-mean loss)."""
    cfg = arm_config(name, arm or "fixed")
    layout = layout_of(cfg)
    model = build_model(cfg.model, cfg.seed)
    batch = step_one_batch(cfg)
    losses, valid = token_losses(model, batch.inputs, batch.labels)
    blocks = Blocks(losses, valid, layout.dp, layout.sp, layout.grad_accum)
    value = (
        blocks.loss.sum() / blocks.N
        if arm is None
        else arm_objective(blocks, cfg.custom.fn, cfg.custom.fsdp_reduce.value)
    )
    value.backward()
    return {n: p.grad for n, p in model.named_parameters()}


def flat(grads: dict) -> torch.Tensor:
    return torch.cat([g.flatten() for _, g in sorted(grads.items())])


def test_every_bug_has_two_arms_with_a_reference_formula_and_a_stated_signature():
    assert len(BUGS) >= 8
    for name in BUGS:
        bug = bug_file(name)
        assert bug.known_bug.reference and bug.known_bug.signature and bug.known_bug.name, name
        assert bug.known_bug.evidence in {kind.value for kind in Evidence} and bug.known_bug.evidence_source, name
        for arm in ("buggy", "fixed"):
            cfg = arm_config(name, arm)
            assert (cfg.custom.fn, cfg.custom.fsdp_reduce.value) in ARMS, (name, arm)
        custom_expectation(bug.known_bug.buggy.expect, bug.world_size)  # a valid expectation


@pytest.mark.slow
@pytest.mark.parametrize("name", BUGS)
def test_each_arm_gives_its_formula_and_the_bug_shows(name):
    cfg = arm_config(name, "buggy")
    got = run_in_world(arm_gradients, cfg.world_size, name)[0]
    for arm in ("buggy", "fixed"):
        want = reference(name, arm)
        for param, grad in want.items():
            assert torch.isfinite(got[arm][param]).all(), f"{name} {arm} {param}: not finite"
            torch.testing.assert_close(
                got[arm][param], grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name} {arm} {param}: {m}"
            )
    true = flat(reference(name, None))
    buggy, fixed = flat(got["buggy"]), flat(got["fixed"])
    torch.testing.assert_close(fixed, true, rtol=1e-4, atol=1e-6)  # the fix: grad L
    norm_factor = bug_file(name).known_bug.buggy.get("grad_norm")
    (buggy_norm, buggy_clip), (fixed_norm, fixed_clip) = got["buggy norm"], got["fixed norm"]
    assert fixed_norm == pytest.approx(true.norm().item(), rel=1e-4)  # the fix logs ||grad L||
    if norm_factor is not None:  # the grad norm alone: the gradient is grad L, its norm k ||grad L||
        torch.testing.assert_close(buggy, true, rtol=1e-4, atol=1e-6)
        factor = grad_norm_factor(norm_factor)
        assert factor != pytest.approx(1.0)
        assert buggy_norm == pytest.approx(factor * true.norm().item(), rel=1e-4)
        assert fixed_clip < 1 and buggy_clip == pytest.approx(fixed_clip / factor, rel=1e-4)  # clipping binds
        return
    assert buggy_norm == pytest.approx(buggy.norm().item(), rel=1e-4)  # a gradient bug: the norm is its own
    stated = custom_expectation(bug_file(name).known_bug.buggy.expect, cfg.world_size)
    cosine = torch.nn.functional.cosine_similarity(buggy, true, dim=0).item()
    if stated == "different":
        assert cosine < 0.9999, f"{name}: the buggy arm's direction is grad L's (cosine {cosine})"
    else:
        torch.testing.assert_close(buggy, stated * true, rtol=1e-4, atol=1e-6)
