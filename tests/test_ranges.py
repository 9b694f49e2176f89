"""Every numeric config field declares its valid range, and no value of such a field reaches a rank and dies there.

Generated from the config dataclasses, not from a list: every numeric field is
tried at -1, 0 and a huge value (and nan, inf for floats). Each value is either
refused before launch with the field named (the checks `python -m runner`
makes: the ranges, the rules between fields, this machine's cores and memory),
or accepted; every accepted config then runs the rank-side code (its parts and
one training step, or the cost loop) in a real two-rank gloo world, which must
finish without raising (a loss that is not finite is a training outcome, not a
crash).
"""

from __future__ import annotations

import math

import pytest
import torch
from gloo_world import run_in_world
from omegaconf import DictConfig

from runner.config import RunConfig, config_with, rank_config
from runner.layout import ParallelLayout
from runner.measure.cost import measure_cost
from runner.model.parallel import build_meshes
from runner.ranges import numeric_fields
from runner.sweep.machine import machine_problems, usable_cpu_cores
from runner.sweep.validate import config_problems
from runner.train.components import build_parts
from runner.train.loop import Trainer

FIELDS = list(numeric_fields(RunConfig))
# Small and quick, so that an accepted value runs one step in a second or less.
BASE = {"train.steps": 2, "train.seq_len": 32, "train.global_batch": 8, "grad_accum": 2, "wandb.mode": "disabled"}
COST = {"cost.modes": ["sum", "local"], "cost.floor_calls": 5, "cost.warmup_steps": 0, "reduction": "sum"}


def candidates(kind: type) -> list:
    extremes = [-1, 0, 10**12]
    return extremes + [math.nan, math.inf] if kind is float else extremes


CASES = [(name, value) for name, kind, _, _ in FIELDS for value in candidates(kind)]


def config_for(name: str, value) -> dict:
    return {**BASE, **(COST if name.startswith("cost.") else {}), name: value}


def refusal(cfg: DictConfig) -> list[tuple[str, str]]:
    """What `python -m runner` refuses of this config before launch: its rules, then this machine's."""
    problems = config_problems(cfg)
    return problems or machine_problems(cfg, cuda_devices=0, cpu_cores=usable_cpu_cores())


def test_every_numeric_field_declares_its_range():
    assert len(FIELDS) >= 30
    assert [name for name, _, valid, _ in FIELDS if valid is None] == []
    for name, _, valid, default in FIELDS:  # the defaults are valid
        assert default is None or valid.holds(default), (name, default)


def first_step_of_each(configs: list[tuple[str, DictConfig]]) -> dict[str, str]:
    """On every rank: build each config's parts and run its first step (the cost loop for a cost job)."""
    outcomes = {}
    for case, composed in configs:
        cfg = rank_config(composed)
        parts = build_parts(cfg, build_meshes(ParallelLayout.from_config(cfg), "cpu"), torch.device("cpu"))
        if cfg.cost.modes:
            result = measure_cost(parts, None)
            outcomes[case] = result.status
        else:
            trainer = Trainer(parts)
            record = trainer.step(1)
            trainer.gather_pending()
            outcomes[case] = "completed" if math.isfinite(record["loss"]) else "diverged"
    return outcomes


@pytest.fixture(scope="module")
def judged() -> tuple[dict, dict]:
    """(refusals, outcomes of the accepted configs' first steps), per (field, value)."""
    refused, accepted = {}, []
    for name, value in CASES:
        cfg = config_with(config_for(name, value))
        problems = refusal(cfg)
        if problems:
            refused[name, value] = problems
        else:
            accepted.append((f"{name}={value}", cfg))
    assert accepted
    outcomes = run_in_world(first_step_of_each, 2, accepted, timeout_s=600)[0] if accepted else {}
    return refused, outcomes


@pytest.mark.parametrize("name, value", CASES, ids=[f"{n}={v}" for n, v in CASES])
def test_a_value_is_refused_naming_its_field_or_runs(judged, name, value):
    refused, outcomes = judged
    if (name, value) in refused:
        messages = " ".join(message for _, message in refused[name, value])
        assert name in messages, f"{name}={value} refused without naming the field: {messages}"
    else:
        assert outcomes[f"{name}={value}"] in ("completed", "diverged")
