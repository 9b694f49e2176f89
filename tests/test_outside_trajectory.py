"""The config keys outside a run's trajectory (runner.trajectory) change nothing a run computes, and the
analysis never splits a comparison group on them.

A real job with every such key the runner reads in a training job set otherwise gives the default job's losses
and grad norms bit for bit; synthetic runs differing in any one such key share their group and baseline, while
a key that does change the trajectory splits them (the null control).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from analysis.gradients.groups import assign_groups
from analysis.load.sweeps import load_sweeps
from analysis.testing.synthetic import SyntheticRun, write_sweep
from runner.config import RunConfig
from runner.trajectory import outside_trajectory
from tests.helpers import run_module
from tests.schema_values import another_value, leaves

OUTSIDE = {key: kind for key, kind in leaves().items() if outside_trajectory(key)}
DEFAULTS = OmegaConf.structured(RunConfig)
BASE = ["train.steps=3", "wandb.mode=disabled", "metrics.count_comm=false"]
# Every key outside the trajectory, set otherwise than in BASE, as one training job takes them together (counting
# needs count_comm, keep_checkpoints needs checkpoints); train.steps runs one step more, compared where both ran.
CHANGED = {
    "train.steps": 4,
    "train.log_every": 1,
    "train.checkpoint_every": 1,
    "train.keep_checkpoints": 1,
    "timeout_s": 900,
    "dist.timeout_s": 120,
    "wandb.mode": "offline",
    "wandb.project": "another-project",
    "wandb.entity": "someone",
    "wandb.log_every": 1,
    "metrics.count_comm": True,
    "metrics.count_first": 1,
    "metrics.count_every": 2,
    "metrics.gather_every": 1,
}
COST_JOB_ONLY = {"cost.modes", "cost.warmup_steps", "cost.floor_calls"}  # a training job refuses them
COMPUTED = ("loss", "reported_loss", "grad_norm", "clip_coef", "valid_tokens", "lr")


def test_the_changed_job_sets_every_key_outside_the_trajectory():
    assert set(CHANGED) | COST_JOB_ONLY == set(OUTSIDE), set(OUTSIDE) ^ (set(CHANGED) | COST_JOB_ONLY)
    assert len(OUTSIDE) >= 15


def _metrics(job: Path) -> dict[int, dict]:
    records = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    return {record["step"]: record for record in records if "loss" in record}


@pytest.mark.slow
def test_keys_outside_the_trajectory_change_no_loss_or_grad_norm(tmp_path):
    changed = [f"{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in CHANGED.items()]
    for name, args in (("0_base", BASE), ("1_changed", changed)):
        done = run_module("runner", [*args, f"hydra.run.dir={tmp_path / 'sweep' / name}"], tmp_path)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    base, other = _metrics(tmp_path / "sweep" / "0_base"), _metrics(tmp_path / "sweep" / "1_changed")
    assert sorted(base) == [1, 2, 3] and sorted(other) == [1, 2, 3, 4]
    for step in base:
        for field in COMPUTED:
            assert base[step][field] == other[step][field], (step, field, base[step][field], other[step][field])
    assert other[1]["comm"] and base[1]["comm"] is None  # the keys did act: the changed job counted
    assert list((tmp_path / "sweep" / "1_changed").rglob("*.distcp")), "the changed job wrote no checkpoint"

    runs = assign_groups(load_sweeps([tmp_path / "sweep"]).runs)
    assert runs["group"].nunique() == 1 and runs["family"].nunique() == 1, runs[["run", "group", "family"]]


# cost.modes is left out: a job that sets it is a cost job, loaded apart from the training runs.
@pytest.mark.parametrize("key", sorted(set(OUTSIDE) - {"cost.modes"}))
def test_a_key_outside_the_trajectory_never_splits_a_group(key, tmp_path):
    value = another_value(OUTSIDE[key], OmegaConf.select(DEFAULTS, key))
    overrides = {} if key == "train.steps" else {key: value}
    runs = load_sweeps(
        [write_sweep(tmp_path / "sweep", [SyntheticRun("sum"), SyntheticRun("local", steps=30, overrides=overrides)])]
    ).runs
    grouped = assign_groups(runs).set_index("reduction")
    assert grouped.loc["sum", "group"] == grouped.loc["local", "group"], (key, value)
    assert grouped.loc["local", "baseline"] == grouped.loc["sum", "run"], (key, value)


def test_a_key_that_changes_the_trajectory_splits_the_group(tmp_path):
    runs = load_sweeps(
        [write_sweep(tmp_path / "sweep", [SyntheticRun("sum"), SyntheticRun("local", overrides={"optim.lr": 0.001})])]
    ).runs
    grouped = assign_groups(runs).set_index("reduction")
    assert grouped.loc["sum", "group"] != grouped.loc["local", "group"]
