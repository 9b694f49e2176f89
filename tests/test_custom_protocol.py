"""The custom-rule protocol (runner.train.custom_rule) in gloo worlds: the post-backward hook, the measured
backward of the graph's all-reduce, what a run records of the upstream code, and the refusals that name
their cause (a number, an integer or detached loss, a tuple of 3, a collective of the rule's own that
timed out)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from gloo_world import run_in_world
from helpers import run_config, run_module, step_one_batch, step_one_through_parts

from runner.data.batches import IGNORE_INDEX
from runner.layout import ParallelLayout
from runner.model.parallel import build_meshes
from runner.model.registry import build_model
from runner.train.custom_rule import custom_rule

CFG = dict(train__seq_len=64, train__global_batch=8, seed=5)
HERE = __name__  # as the ranks import this module (the runner then finds the same one)
SEEN = {}


def _local_sum(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum", ignore_index=IGNORE_INDEX)


def _times_world(model, ctx):
    """After the backward: record that FSDP's reduced gradients are there, then undo its 1/W."""
    SEEN["grads_at_hook"] = sum(p.grad is not None for p in model.parameters())
    SEEN["hook_calls"] = SEEN.get("hook_calls", 0) + 1
    for p in model.parameters():
        p.grad.to_local().mul_(ctx.world_size)


@custom_rule(finish_gradients=_times_world)
def local_then_times_world(logits, labels, ctx):
    """S/N under FSDP's mean (grad L / W), x W after the backward: grad L."""
    return _local_sum(logits, labels) / ctx.global_tokens


def hooked_step(layout: ParallelLayout) -> tuple:
    cfg = run_config(reduction="custom", custom__fn=f"{HERE}:local_then_times_world", grad_accum=2, **CFG)
    step, parts = step_one_through_parts(cfg, build_meshes(layout, "cpu"))
    n_params = len(list(parts.model.parameters()))
    return step.loss, {n: p.grad.full_tensor() for n, p in parts.model.named_parameters()}, dict(SEEN), n_params


def test_finish_gradients_runs_once_after_the_backward_and_its_scaling_stays():
    loss, grads, seen, n_params = run_in_world(hooked_step, 2, ParallelLayout(2, 1, 2))[0]
    assert seen == {"grads_at_hook": n_params, "hook_calls": 1}  # once per step, every gradient already there
    cfg = run_config(grad_accum=2, **CFG)
    batch = step_one_batch(cfg)
    model = build_model(cfg.model, cfg.seed)
    F.cross_entropy(model(batch.inputs).flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX).backward()
    for name, param in model.named_parameters():  # grad L, not grad L / 2
        torch.testing.assert_close(grads[name], param.grad, msg=lambda m: f"{name}: {m}")


def _number(logits, labels, ctx):
    return _local_sum(logits, labels).item()


def _integer(logits, labels, ctx):
    return (labels != IGNORE_INDEX).sum()


def _detached(logits, labels, ctx):
    return _local_sum(logits, labels).detach()


def _triple(logits, labels, ctx):
    loss = _local_sum(logits, labels)
    return loss, loss.detach(), 1.0


def _vector(logits, labels, ctx):
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none", ignore_index=IGNORE_INDEX)


REFUSED = {
    "_number": "returned a float",
    "_integer": "returned an integer loss (torch.int64)",
    "_detached": "returned a detached loss (requires_grad=False)",
    "_triple": "returned a tuple of 3 values",
    "_vector": "returned a loss of shape (",
}


def refusals() -> dict[str, str]:
    meshes = build_meshes(ParallelLayout(1, 1, 1), "cpu")
    messages = {}
    for name in REFUSED:
        cfg = run_config(reduction="custom", custom__fn=f"{HERE}:{name}", world_size=1, grad_accum=1, **CFG)
        try:
            step_one_through_parts(cfg, meshes)
        except RuntimeError as error:
            messages[name] = str(error)
    return messages


def test_a_loss_that_cannot_be_backpropagated_is_refused_naming_why():
    messages = run_in_world(refusals, 1)[0]
    for name, cause in REFUSED.items():
        assert name in messages, f"{name} was not refused"
        assert messages[name].startswith(f"custom.fn={HERE}:{name} ") and cause in messages[name], messages[name]


def provenance(specs: list[dict]) -> list[dict]:
    meshes = build_meshes(ParallelLayout(2, 1, 1), "cpu")
    from runner.train.components import build_parts

    return [
        build_parts(run_config(grad_accum=1, **CFG, **spec), meshes, torch.device("cpu")).provenance() for spec in specs
    ]


def test_the_graph_all_reduce_backward_is_measured_once_and_the_upstream_recorded():
    specs = [
        dict(reduction="sum", autograd_all_reduce="funcol"),
        dict(reduction="sum", autograd_all_reduce="identity"),
        dict(reduction="custom", custom__fn="runner.trainers.xtuner:released"),
        dict(reduction="custom", custom__fn="runner.trainers.counterexample:sum_backward_under_fsdp_sum"),
        dict(reduction="custom", custom__fn="runner.trainers.torchtitan:loss"),
        dict(reduction="custom", custom__fn="runner.trainers.megatron:per_token"),
        dict(reduction="local"),
    ]
    funcol, identity, xtuner, counter, titan, megatron, local = run_in_world(provenance, 2, specs)[0]
    assert funcol["all_reduce_backward"]["per_rank"] == [2.0, 2.0] and funcol["all_reduce_backward"]["as_expected"]
    assert (
        identity["all_reduce_backward"]["per_rank"] == [1.0, 1.0] and identity["all_reduce_backward"]["expected"] == 1
    )
    assert (
        xtuner["all_reduce_backward"]["implementation"] == "torch_nn" and xtuner["all_reduce_backward"]["factor"] == 2
    )
    assert counter["all_reduce_backward"]["implementation"] == "funcol"  # ctx.all_reduce: the configured one
    assert "all_reduce_backward" not in titan and "all_reduce_backward" not in local and "custom_upstream" not in local
    code, *tests = titan["custom_upstream"]  # the package that ran, then the tests that hold it (`Tested`)
    assert [code] == [
        {
            "package": "torchtitan",
            "version": "0.3.0",
            "calls": ["torchtitan.components.loss.CrossEntropyLoss", "torchtitan.distributed.utils.dist_sum_tensor"],
            "follows": titan["custom_upstream"][0]["follows"],
        }
    ]
    assert tests and all(test["evidence"] == "release" and test["test"].startswith("tests/") for test in tests)
    (source,) = megatron["custom_upstream"]
    assert source["repository"] == "NVIDIA/Megatron-LM" and len(source["commit"]) == 40
    assert any("finalize_model_grads" in f for f in source["files"])


HANGS = '''
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


def rank_zero_only(logits, labels, ctx):
    """A collective only rank 0 calls: it waits for peers that never come."""
    if ctx.rank == 0:
        dist.all_reduce(torch.ones(1), group=ctx.world_group)
    else:
        time.sleep(20)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
'''


@pytest.mark.slow
def test_a_collective_of_the_rule_that_times_out_is_named_as_such(tmp_path):
    (tmp_path / "hangs.py").write_text(HANGS)
    args = ["reduction=custom", "custom.fn=hangs:rank_zero_only", "dist.timeout_s=4", "train.steps=1"]
    done = run_module("runner", [*args, "wandb.mode=disabled", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["failed_rank"] == 0
    error = summary["error"]
    assert "custom.fn=hangs:rank_zero_only: a collective it issued in micro-batch 0 timed out" in error, error
    assert "dist.timeout_s=4 s" in error and "every rank of its group must call it" in error


@pytest.mark.slow
def test_a_rule_that_logs_0_over_0_is_recorded_and_the_run_goes_on(tmp_path):
    """The Hugging Face Trainer without loss kwargs takes each micro-batch shard's token mean: NaN over the empty
    micro-batch of data.valid_tokens=one_empty. Its gradient there is 0, so the run completes; the record says so."""
    args = ["trainer=hf_trainer_no_loss_kwargs", "data.valid_tokens=one_empty", "train.steps=2", "wandb.mode=disabled"]
    done = run_module("runner", [*args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reported loss not finite at step 1" in done.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["reported_loss_not_finite"] == {"first_step": 1, "steps": 2}
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["reported_loss"] for r in records] == [None, None]  # JSON's null for NaN
    assert all(r["micro_batch_tokens_min"] == 0 and r["loss"] > 0 for r in records)


def _true_norm(grads, ctx):
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0).full_tensor()


@custom_rule(grad_norm=lambda grads, ctx: 2 * _true_norm(grads, ctx))
def norm_twice(logits, labels, ctx):
    return _local_sum(logits, labels) / ctx.global_tokens


@custom_rule(grad_norm=lambda grads, ctx: _true_norm(grads, ctx) * (1 + ctx.rank))
def norm_per_rank(logits, labels, ctx):
    return _local_sum(logits, labels) / ctx.global_tokens


@custom_rule(grad_norm=lambda grads, ctx: _true_norm(grads, ctx) * float("nan"))
def norm_nan(logits, labels, ctx):
    return _local_sum(logits, labels) / ctx.global_tokens


def trainer_steps(names: list[str]) -> dict:
    """On every rank: step 1 of each rule through the Trainer (clipping with its hook); its record or its error."""
    from runner.train.components import build_parts
    from runner.train.custom_rule import CustomRuleError
    from runner.train.loop import Trainer

    meshes = build_meshes(ParallelLayout(2, 1, 1), "cpu")
    out = {}
    for name in names:
        cfg = run_config(reduction="custom", custom__fn=f"{HERE}:{name}", grad_accum=1, train__steps=1, **CFG)
        try:
            out[name] = Trainer(build_parts(cfg, meshes, torch.device("cpu"))).step(1)
        except CustomRuleError as error:
            out[name] = str(error)
    return out


def test_a_grad_norm_hook_is_held_to_the_world_and_to_the_true_norm():
    done = run_in_world(trainer_steps, 2, ["norm_twice", "norm_per_rank", "norm_nan"])[0]
    twice = done["norm_twice"]
    assert twice["grad_norm"] == pytest.approx(2 * twice["true_grad_norm"], rel=1e-6)
    assert twice["true_grad_norm"] > 0
    assert (
        f"custom.fn={HERE}:norm_per_rank's grad_norm hook returned a different norm on each rank ("
        in (done["norm_per_rank"])
    )
    assert "each rank would clip by its own factor" in done["norm_per_rank"]
    assert f"custom.fn={HERE}:norm_nan's grad_norm hook returned nan while the gradient's norm is " in done["norm_nan"]
