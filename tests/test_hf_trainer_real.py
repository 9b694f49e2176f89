"""The real `transformers.Trainer` beside the project's `trainer=hf_trainer*` rules: same model, data, layout.

Held: in one 2-process gloo world (CPU), for the three settings (conf/trainer/):
- hf_trainer.yaml (`runner.trainers.hf_trainer:loss`): average_tokens_across_devices True;
- hf_trainer_per_device.yaml (`:loss_per_device`): average_tokens_across_devices False;
- hf_trainer_no_loss_kwargs.yaml (`:no_loss_kwargs`): a model whose `accepts_loss_kwargs` is False, set on the
  model instance before the Trainer is built, as a user's model (or transformers' own Qwen2.5-VL, Gemma 4, ...
  with their class attribute) does;
- the project's step 1 runs through its own path (`build_parts`: the hf_llama preset, a 2-layer
  LlamaForCausalLM built from the seed, sharded by FSDP2 with custom.fsdp_reduce; the reducer from custom.fn;
  `forward_backward`), W=2 grad_accum=2, data.valid_tokens=skewed, so the four micro-batches and the two
  ranks hold very unequal valid-target counts (none of them zero);
- the installed `transformers.Trainer` (DDP over the same gloo world, use_cpu, gradient_accumulation_steps=2,
  max_steps=1, no clipping, sequential sampling) trains a model built from the same seed (bit-identical
  weights) on the same rows, fed so that accelerate's batch sharding (batch b to rank b % W) hands every rank
  the micro-batches the project's `local_micro_batches` gives it, in the same order. The project's labels are
  already shifted, so they go in as `shift_labels` (which both the model's loss and
  `Trainer._get_num_items_in_batch` take as they are; remove_unused_columns=False keeps them);
- the Trainer's accumulated gradient (DDP's mean over the ranks, read in `on_pre_optimizer_step`, before the
  optimizer) equals the rule's global gradient (FSDP's mean, full tensors), and the Trainer's logged loss equals
  the rule's logged loss (the runner's `reported_loss`), to rtol 1e-5;
- the null controls: each of the other two settings gives a gradient and a logged loss other than hf_trainer's
  on these data, so the comparisons above can fail.

The path the installed Trainer takes for a model with `accepts_loss_kwargs = False` (transformers 5.25.0, which
requirements.lock installs; transformers/trainer.py):
- `Trainer.__init__`, lines 517-523: `model_accepts_loss_kwargs` is the unwrapped model's `accepts_loss_kwargs`
  where it has one, else whether its forward takes **kwargs (LlamaForCausalLM's does: True, the other two
  settings' path); the test asserts the Trainer read False;
- `_get_num_items_in_batch`, lines 2355-2366: no count unless the model accepts loss kwargs or a
  `compute_loss_func` is given: `num_items_in_batch` is None (asserted in every `training_step`);
- `compute_loss`, lines 2204-2209: num_items_in_batch is not passed to the model, so its loss
  (`ForCausalLMLoss`, loss/loss_utils.py `fixed_cross_entropy` line 42, reduction "mean") is the micro-batch's
  token mean; lines 2244-2252: no multiplication by the number of processes;
- `training_step`, lines 2148-2156: the loss is not "scaled for GA", so it is divided by
  `current_gradient_accumulation_steps` (line 1922: the step's micro-batches, 2) before backward;
- DDP averages the gradients over the W ranks: (1/(W M)) sum_rm grad(token mean of micro-batch rm), the rule's
  `no_loss_kwargs`; the logged loss (lines 1968, 2294) is each rank's sum of those divided losses, averaged
  over the processes: (1/W) sum_r sum_m mean_rm / M, which is the runner's `reported_loss` of the rule. A
  micro-batch with no target would give a NaN loss, which (by the source, not run here) the Trainer's default
  `logging_nan_inf_filter` (lines 1955-1961) keeps out of its log while the rule reports NaN; on these data no
  micro-batch is empty, and both logged losses are asserted finite.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from gloo_world import run_in_world
from helpers import run_config, step_one_through_parts
from omegaconf import OmegaConf

PRESETS = Path(__file__).resolve().parents[1] / "conf" / "trainer"
# preset -> (the Trainer's average_tokens_across_devices, the model's accepts_loss_kwargs)
SETTINGS = {
    "hf_trainer": (True, True),
    "hf_trainer_per_device": (False, True),
    "hf_trainer_no_loss_kwargs": (True, False),  # the default average: unread on this path
}
WORLD, GRAD_ACCUM = 2, 2

pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")


def preset_config(name: str):
    loaded = OmegaConf.load(PRESETS / f"{name}.yaml")
    return run_config(
        "hf_llama",
        world_size=WORLD,
        sp=1,
        grad_accum=GRAD_ACCUM,
        reduction="custom",
        custom__fn=loaded.custom.fn,
        custom__fsdp_reduce=loaded.custom.fsdp_reduce,
        train__global_batch=8,
        train__seq_len=48,
        data__valid_tokens="skewed",
        seed=7,
    )


class Rows(torch.utils.data.Dataset):
    """The step's rows in the order accelerate deals them: dataset batch b = m * W + r is rank r's micro-batch m."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor, rows_per_micro: int):
        rows_per_rank = rows_per_micro * GRAD_ACCUM
        order = [
            r * rows_per_rank + m * rows_per_micro + i
            for m in range(GRAD_ACCUM)
            for r in range(WORLD)
            for i in range(rows_per_micro)
        ]
        self.inputs, self.labels = inputs[order], labels[order]

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> dict:
        labels = self.labels[index]
        return {"input_ids": self.inputs[index], "labels": labels, "shift_labels": labels}


def trainer_step(cfg, batch, average: bool, accepts_loss_kwargs: bool, output_dir: str) -> tuple[dict, float, list]:
    """On every rank: one step of the installed Trainer; (its pre-optimizer gradient, its logged loss, the
    valid targets of each micro-batch this rank was handed)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from runner.model.registry import build_model

    model = build_model(cfg.model, cfg.seed).hf  # the LlamaForCausalLM the project's HFCausalLM wraps
    if not accepts_loss_kwargs:
        model.accepts_loss_kwargs = False  # what Trainer.__init__ reads before it inspects forward's signature
    seen: dict = {"grads": None, "loss": None, "counts": []}

    class Capture(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            seen["grads"] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}

        def on_log(self, args, state, control, logs=None, **kwargs):
            if "loss" in logs:
                seen["loss"] = logs["loss"]

    class CountingTrainer(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            seen["counts"].append(int((inputs["shift_labels"] != -100).sum()))
            # the count reaches the model (and the loss is not divided by M) only where the model accepts it
            assert (num_items_in_batch is not None) == accepts_loss_kwargs
            return super().training_step(model, inputs, num_items_in_batch)

    rows_per_micro = cfg.train.global_batch // (WORLD * GRAD_ACCUM)
    args = TrainingArguments(
        output_dir=output_dir,
        use_cpu=True,
        ddp_backend="gloo",
        per_device_train_batch_size=rows_per_micro,
        gradient_accumulation_steps=GRAD_ACCUM,
        max_steps=1,
        max_grad_norm=0.0,  # no clipping
        average_tokens_across_devices=average,
        train_sampling_strategy="sequential",
        logging_strategy="steps",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        remove_unused_columns=False,  # else shift_labels (a loss kwarg, not in forward's signature) is dropped
        seed=cfg.seed,
    )
    trainer = CountingTrainer(
        model=model, args=args, train_dataset=Rows(batch.inputs, batch.labels, rows_per_micro), callbacks=[Capture()]
    )
    # the path each rule follows: num_items_in_batch reaches the loss, or (no_loss_kwargs) it does not
    assert trainer.model_accepts_loss_kwargs is accepts_loss_kwargs
    trainer.train()
    return seen["grads"], seen["loss"], seen["counts"]


def both_paths(output_dir: str) -> dict:
    """On every rank: for each setting, (rule's gradient, rule's logged loss, L, Trainer's gradient, Trainer's
    logged loss, the rule's and the Trainer's per-micro-batch counts on this rank)."""
    import torch.distributed as dist

    from runner.layout import ParallelLayout
    from runner.model.parallel import build_meshes

    meshes = build_meshes(ParallelLayout(WORLD, 1, GRAD_ACCUM), "cpu")
    out = {}
    for name, (average, accepts_loss_kwargs) in SETTINGS.items():
        cfg = preset_config(name)
        step, parts = step_one_through_parts(cfg, meshes)
        rule = {n.removeprefix("hf."): p.grad.full_tensor() for n, p in parts.model.named_parameters()}
        batch = parts.batches(1)
        ours = [mb.valid_tokens for mb in parts.local_share(batch)]
        grads, logged, counts = trainer_step(
            cfg, batch, average, accepts_loss_kwargs, f"{output_dir}/{name}-{dist.get_rank()}"
        )
        out[name] = dict(
            rule=rule, rule_loss=step.reported, L=step.loss, trainer=grads, trainer_loss=logged, ours=ours, seen=counts
        )
    return out


@pytest.mark.slow
def test_the_hf_trainer_rules_give_the_real_trainers_gradient_and_logged_loss(tmp_path):
    ranks = run_in_world(both_paths, WORLD, str(tmp_path), timeout_s=540)
    for name in SETTINGS:
        counts = [rank[name]["ours"] for rank in ranks]
        assert [rank[name]["seen"] for rank in ranks] == counts  # the Trainer saw each rank's micro-batches
    counts = [rank["hf_trainer"]["ours"] for rank in ranks]
    assert len({c for rank in counts for c in rank}) == WORLD * GRAD_ACCUM  # four unequal micro-batches
    assert min(c for rank in counts for c in rank) > 0  # none empty: no NaN loss on either side
    assert sum(counts[0]) != sum(counts[1])  # and unequal ranks: the per-device setting must differ
    result = ranks[0]
    for name in SETTINGS:
        got = result[name]
        assert set(got["rule"]) == set(got["trainer"])
        scale = max(float(g.abs().max()) for g in got["trainer"].values())
        for param, grad in got["trainer"].items():
            torch.testing.assert_close(
                got["rule"][param], grad, rtol=1e-5, atol=1e-6 * scale, msg=lambda m: f"{name} {param}: {m}"
            )
        assert math.isfinite(got["trainer_loss"]) and math.isfinite(got["rule_loss"]), name
        assert got["rule_loss"] == pytest.approx(got["trainer_loss"], rel=1e-5), name
        for rank in ranks[1:]:  # DDP and FSDP both leave every rank the same global gradient
            torch.testing.assert_close(rank[name]["trainer"], got["trainer"], rtol=0, atol=0)
    default = result["hf_trainer"]
    assert default["rule_loss"] == pytest.approx(default["L"], rel=1e-5)  # average=True logs L
    flat = {name: torch.cat([g.flatten() for g in result[name]["trainer"].values()]) for name in SETTINGS}
    for name in ("hf_trainer_per_device", "hf_trainer_no_loss_kwargs"):  # the null controls
        assert not torch.allclose(flat["hf_trainer"], flat[name], rtol=1e-3, atol=0), f"{name} must differ"
        # the logged token means differ less (random weights: every token's loss is near log 256), but by more
        # than the tolerance the losses were held to above
        assert result[name]["trainer_loss"] != pytest.approx(default["trainer_loss"], rel=1e-5), name
