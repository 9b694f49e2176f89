"""`experiment=bugs` and `bug=NAME`: one job per known bug (conf/bug/) and arm (conf/bug_arm/), each at the bug's
layout, each admitted by the launcher's checks; and, slow, the whole experiment run and judged by `--check`.

The arms' math is tested in gloo worlds (tests/test_bug_rules.py), the analysis on synthetic sweeps
(tests/test_bugs_analysis.py).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from helpers import run_module
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from analysis.bugs.table import REPRODUCED_BY, SHOWN_AS
from runner.config import register_configs, run_config_from
from runner.modes import grad_norm_factor
from runner.sweep.custom_check import check_all, forget_checked
from runner.sweep.validate import config_problems

CONF = Path(__file__).resolve().parents[1] / "conf"
BUGS = sorted(path.stem for path in (CONF / "bug").glob("*.yaml"))
ARMS = ["buggy", "fixed", "reference"]
register_configs()


def composed(overrides: list[str], hydra_node: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides, return_hydra_config=hydra_node)


@pytest.fixture
def arms_checked():
    """Every arm's callable checked in one subprocess, as the sweep's preflight does (`check_all`): the per-job
    checks then answer from it instead of one subprocess per callable. Forgotten after the test."""
    check_all(
        [OmegaConf.load(CONF / "bug" / f"{bug}.yaml").known_bug[arm].fn for bug in BUGS for arm in ("buggy", "fixed")]
    )
    yield
    forget_checked()


def test_every_bug_and_arm_is_a_job_at_the_bugs_layout_and_every_job_is_admitted(arms_checked):
    params = composed(["experiment=bugs"], hydra_node=True).hydra.sweeper.params
    assert sorted(params.bug.split(",")) == BUGS and params.bug_arm.split(",") == ARMS
    assert len(BUGS) >= 8
    modes = set()
    for bug in BUGS:
        stated = OmegaConf.load(CONF / "bug" / f"{bug}.yaml")
        for arm in ARMS:
            cfg = run_config_from(composed(["experiment=bugs", f"bug={bug}", f"bug_arm={arm}"]))
            layout = (cfg.world_size, cfg.sp, cfg.grad_accum, cfg.dp_replicate)
            assert layout == (stated.world_size, stated.sp, stated.grad_accum, stated.get("dp_replicate", 1)), bug
            assert cfg.data.valid_tokens.value == stated.get("data", {}).get("valid_tokens", "full")
            assert cfg.known_bug.name == stated.known_bug.name and cfg.train.steps == 3
            for key, value in stated.get("optim", {}).items():  # every arm trains as the bug states (a clip that binds)
                assert OmegaConf.select(OmegaConf.structured(cfg), f"optim.{key}") == value, (bug, arm, key)
            if arm == "reference":
                assert cfg.reduction.value == "sum" and cfg.custom.fn is None
            else:
                arm_stated = stated.known_bug[arm]
                assert (cfg.reduction.value, cfg.custom.fn) == ("custom", arm_stated.fn)
                assert cfg.custom.fsdp_reduce.value == arm_stated.fsdp_reduce
                assert cfg.custom.expect == arm_stated.get("expect", "grad L")
                modes.add((cfg.custom.fn, cfg.custom.fsdp_reduce.value))
            assert config_problems(cfg, sweeping=True) == [], (bug, arm)  # admitted: no refusal, no unread key
    assert len(modes) >= 12  # the arms are real rules, not one rule relabelled


def test_one_bug_alone_sweeps_its_three_arms_and_without_a_sweep_runs_its_buggy_arm():
    one = composed(["bug=double_ga_scaling"], hydra_node=True)
    assert one.hydra.sweeper.params.bug_arm.split(",") == ARMS and "reduction" not in one.hydra.sweeper.params
    cfg = run_config_from(composed(["bug=double_ga_scaling"]))
    assert cfg.custom.fn == "runner.trainers.transformers_bugs:double_ga" and cfg.custom.expect == "4"
    assert run_config_from(composed([])).known_bug.name is None  # no bug unless one is chosen


@pytest.mark.slow
def test_the_bugs_experiment_runs_and_check_finds_every_bug_as_stated(tmp_path):
    quick = ["hydra.sweep.dir=bugs"]
    ran = run_module("runner", ["-m", "experiment=bugs", *quick], tmp_path, timeout=3600)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    checked = run_module("analysis", [str(tmp_path / "bugs"), "--check", "--no-plots", "--wandb", "disabled"], tmp_path)
    out = checked.stdout + checked.stderr
    assert checked.returncode == 0, out
    assert f"check: all {len(BUGS)} known bugs show as stated, each fix equivalent to the reference: " in out
    results = pd.read_csv(tmp_path / "bugs" / "analysis" / "bugs.csv").set_index("bug")["result"]
    for name in BUGS:
        kind = OmegaConf.load(CONF / "bug" / f"{name}.yaml").known_bug
        assert results[kind.name] == ("reproduced" if kind.evidence in REPRODUCED_BY else SHOWN_AS[kind.evidence])


@pytest.mark.parametrize(
    "given, valid", [("sqrt(2)", 2**0.5), ("2", 2.0), ("1/2", 0.5), ("sqrt(x)", None), ("0", None), ("twice", None)]
)
def test_a_grad_norm_factor_is_sqrt_k_or_k_and_anything_else_is_refused_naming_the_field(given, valid):
    cfg = run_config_from(composed(["bug=grad_norm_wrong_group", f"known_bug.buggy.grad_norm='{given}'"]))
    problems = dict(config_problems(cfg, sweeping=False))
    if valid is not None:
        assert grad_norm_factor(given) == pytest.approx(valid) and "known_bug.buggy.grad_norm" not in problems
    else:
        message = problems["known_bug.buggy.grad_norm"]
        assert f"known_bug.buggy.grad_norm={given}" in message and "sqrt(k)" in message
