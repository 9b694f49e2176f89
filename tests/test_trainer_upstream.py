"""The trainers' rules against the installed upstream code they follow but cannot call in the loop, and the
refusal of a rule whose package is missing.

- transformers: `Trainer._get_num_items_in_batch` and `Trainer.compute_loss` of the installed version,
  called on a stand-in Trainer holding just what they read, give the count and the loss that
  runner/trainers/hf_trainer.py computes (importing transformers.trainer costs ~12 s, too much per rank).
- torchtitan: `disable_fsdp_gradient_division` leaves FSDP with the divide factor that the runner's
  `custom.fsdp_reduce=sum` sets (which adds SUM-only comms, since gloo lacks PREMUL_SUM).
- A rule whose package is not installed is refused before any rank starts, with the one command that
  installs it (from any working directory).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from gloo_world import run_in_world
from helpers import run_module

from runner.trainers import hf_trainer

REPO = Path(__file__).resolve().parents[1]


class TrainerStandIn:
    """What `Trainer._get_num_items_in_batch` and `Trainer.compute_loss` read of a Trainer (no parallelism
    config, one GPU per process); cp_size is the context-parallel size the runner's sp shards play."""

    def __init__(self, average_tokens_across_devices: bool, model_accepts_loss_kwargs: bool, processes: int, cp: int):
        self.args = SimpleNamespace(average_tokens_across_devices=average_tokens_across_devices, world_size=1, n_gpu=1)
        self.accelerator = SimpleNamespace(num_processes=processes, parallelism_config=None)
        self.model_accepts_loss_kwargs = model_accepts_loss_kwargs
        self.compute_loss_func = None
        self.label_smoother = None
        self._loss_shifts_labels = True
        self.cp = cp

    def get_tp_size(self) -> int:
        return 1

    def get_cp_size(self) -> int:
        return self.cp

    def get_sp_size(self) -> int:
        return 1


@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("accepts", [True, False])
def test_the_hf_rules_count_and_scale_as_the_installed_trainer(average, accepts):
    from transformers.trainer import Trainer

    torch.manual_seed(0)
    labels = [torch.randint(0, 50, (2, 8)) for _ in range(2)]
    for row in labels:
        row[0, 5:] = -100
    logits = torch.randn(2, 8, 50)
    processes, cp = 4, 2
    trainer = TrainerStandIn(average, accepts, processes, cp)
    samples = [{"labels": torch.zeros(1), "shift_labels": rows} for rows in labels]  # counted: the shifted labels
    upstream_count = Trainer._get_num_items_in_batch(trainer, samples, torch.device("cpu"))
    ctx = SimpleNamespace(
        sequence_labels=tuple(labels), ignore_index=-100, world_size=1, sp=cp, device=torch.device("cpu"), grad_accum=2
    )
    ours = hf_trainer.num_items_in_batch(ctx, average)  # world_size 1: no gather (the stand-in gathers nothing)
    if not accepts:
        assert upstream_count is None  # the Trainer counts nothing: the model takes the mean
    else:
        assert torch.is_floating_point(upstream_count) and upstream_count.item() == ours.item()  # true division / cp
    ctx = SimpleNamespace(**vars(ctx), plan=ours if accepts else None)
    ctx.world_size = processes
    model = lambda **inputs: {"loss": hf_trainer._model_loss(logits, labels[0], ctx, inputs.get("num_items_in_batch"))}  # noqa: E731
    upstream = Trainer.compute_loss(trainer, model, {}, num_items_in_batch=upstream_count)
    scaled_for_ga = accepts and upstream_count is not None  # Trainer.training_step
    upstream = upstream if scaled_for_ga else upstream / ctx.grad_accum
    ours, _ = hf_trainer._trainer_loss(logits, labels[0], ctx, average, accepts)
    torch.testing.assert_close(ours, upstream)


def divide_factors() -> tuple[list, list]:
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torchtitan.distributed.fsdp import disable_fsdp_gradient_division

    from runner.model.parallel import set_gradient_reduction

    def sharded():
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        for layer in model:
            fully_shard(layer)
        return fully_shard(model)

    def factors(model):  # of each FSDP unit that holds parameters (the root Sequential holds none)
        groups = [m._get_fsdp_state()._fsdp_param_group for m in model.modules() if isinstance(m, FSDPModule)]
        return [group.gradient_divide_factor for group in groups if group is not None]

    titan, ours = sharded(), sharded()
    disable_fsdp_gradient_division(titan)
    set_gradient_reduction(ours, "sum")
    return factors(titan), factors(ours)


def test_torchtitans_divide_factor_is_the_one_fsdp_reduce_sum_sets():
    titan, ours = run_in_world(divide_factors, 1)[0]
    assert titan == ours == [1.0, 1.0]


BLOCKER = """
import importlib.abc
import sys


class HideTorchtitan(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torchtitan" or name.startswith("torchtitan."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, HideTorchtitan())
"""


def test_a_rule_whose_package_is_missing_is_refused_with_the_command_that_installs_it(tmp_path):
    hidden = tmp_path / "hide"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text(BLOCKER)  # this interpreter, as if torchtitan were not installed
    env = {**os.environ, "PYTHONPATH": str(hidden)}
    done = run_module("runner", ["trainer=torchtitan", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "invalid" and summary["problems"] == ["custom.fn"]
    assert "needs torchtitan==0.3.0, which is not installed here" in summary["error"]
    # the one command, for this install: the Makefile's where the tests run in the .venv it set up, else pip
    made = Path(sys.prefix).resolve() == (Path(REPO) / ".venv").resolve()
    assert (f"make -C {REPO} setup-trainers" if made else f'-m pip install -e "{REPO}[trainers]"') in summary["error"]
    assert not (tmp_path / "run" / "logs").exists()  # refused before any rank started
