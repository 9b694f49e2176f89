"""`experiment=rl`: the post-training modes (conf/trainer/ verl_*, trl_*, paper_*, and `reference`) at every
layout= option it sweeps, each a distinct mode under objective=pg with stated expectations.

The rules' math is tested in gloo worlds (tests/test_rl_rules.py); here, that the experiment composes into
the jobs it promises, each valid, named apart, importable, and that the layout expectations read as stated.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from runner.callables import callable_problem
from runner.config import register_configs, run_config_from
from runner.modes import UNITS, layout_expectation, run_mode_label
from runner.sweep.objective_rules import objective_problems

CONF = Path(__file__).resolve().parents[1] / "conf"
register_configs()
LAYOUTS = {"w1": (1, 1, 1), "w1_ga2": (1, 1, 2), "w2": (2, 2, 1), "w2_sp2": (2, 1, 1)}  # (W, dp, GA) by name
SP = {"w1": 1, "w1_ga2": 1, "w2": 1, "w2_sp2": 2}
# What each option's gradient is against the same option at W=1 GA=1, at each layout (tests/rl_references.py
# has the formulas): 1.0 the same, "different" another direction.
CHANGES_WITH = {
    "verl_seq_mean_token_sum_norm": ("dp", "grad_accum"),
    "verl_legacy_token_mean": ("dp", "grad_accum"),
    "verl_cp_count_token_mean": ("sp",),
    "trl_bnpo": ("dp", "grad_accum"),
    "trl_dapo_spg1": ("grad_accum",),
}
WEIGHS = {
    "verl_seq_mean_token_mean": "response",
    "trl_grpo": "response",
    "paper_grpo": "response",
    "paper_dapo": "prompt",
}


def composed(overrides: list[str], hydra_node: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides, return_hydra_config=hydra_node)


def test_every_option_is_a_distinct_valid_pg_mode_with_its_expectations_at_every_layout():
    params = composed(["experiment=rl"], hydra_node=True).hydra.sweeper.params
    trainers = params.trainer.split(",")
    assert params.layout.split(",") == list(LAYOUTS)
    assert {t.split("_")[0] for t in trainers} == {"reference", "verl", "trl", "paper"}
    labels = set()
    for layout, (world_size, dp, grad_accum) in LAYOUTS.items():
        for trainer in trainers:
            cfg = run_config_from(composed(["experiment=rl", f"layout={layout}", f"trainer={trainer}"]))
            assert (cfg.world_size, cfg.world_size // cfg.sp, cfg.grad_accum) == (world_size, dp, grad_accum)
            assert cfg.objective.name.value == "pg" and objective_problems(cfg) == []
            labels.add(run_mode_label(cfg))
            if trainer == "reference":
                continue
            assert callable_problem(cfg.custom.fn) is None
            stated = layout_expectation(cfg.custom.expect_layouts, dp, cfg.sp, grad_accum)
            sizes = {"dp": dp, "sp": cfg.sp, "grad_accum": grad_accum}
            changes = any(sizes[axis] > 1 for axis in CHANGES_WITH.get(trainer, ()))
            assert stated == ("different" if changes else 1.0), (trainer, layout)
            assert cfg.custom.weighs == WEIGHS.get(trainer, "token") and cfg.custom.weighs in UNITS
            assert cfg.custom.rule and cfg.custom.name
    assert len(labels) == len(trainers)


@pytest.mark.parametrize(
    "expect, layout, want",
    [
        ("invariant", (4, 2, 8), 1.0),
        ("x sp", (2, 4, 1), 4.0),
        ("× grad_accum", (2, 1, 3), 3.0),
        ("changes with dp, grad_accum", (1, 2, 1), 1.0),
        ("changes with dp, grad_accum", (1, 1, 2), "different"),
        ("changes with sp", (2, 2, 1), "different"),
    ],
)
def test_a_layout_expectation_reads_as_a_factor_or_another_direction(expect, layout, want):
    assert layout_expectation(expect, *layout) == want


@pytest.mark.parametrize("expect", ["sometimes", "x tp", "changes with", "changes with dp, world"])
def test_an_unreadable_layout_expectation_names_the_valid_forms(expect):
    with pytest.raises(ValueError, match="invariant, x AXIS"):
        layout_expectation(expect, 1, 1, 1)
