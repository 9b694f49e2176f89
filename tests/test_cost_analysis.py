"""The cost figures on synthetic data with known answers: pairing, the exact randomisation test and its CI,
Holm's correction, the null control; and B1's block bootstrap."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.cost.bootstrap import moving_blocks, paired_overheads
from analysis.cost.comm import comm_table
from analysis.cost.interleaved import cost_table
from analysis.gradients.groups import assign_groups
from analysis.load.sweeps import load_sweeps
from analysis.pipeline import analyze
from analysis.testing.synthetic import SyntheticRun, write_cost_job, write_sweep


def test_sequential_step_time_ratio_pairs_with_matching_counter_settings_and_averages_repeats(tmp_path):
    layout = dict(world_size=2, grad_accum=2)
    uncounted = {"metrics.count_comm": False}
    runs = [
        SyntheticRun("sum", **layout),
        SyntheticRun("local", step_time_factor=1.0, **layout),
        SyntheticRun("local", step_time_factor=1.2, **layout),  # a repeat: averaged with the one above
        SyntheticRun("local", step_time_factor=0.5, overrides=uncounted, **layout),  # another cost: not a partner
        SyntheticRun("sum", step_time_factor=0.5, overrides=uncounted, **layout),
    ]
    loaded = load_sweeps([write_sweep(tmp_path / "sweep", runs)])
    comm = comm_table(assign_groups(loaded.runs).reset_index(drop=True), loaded.steps)
    counted_sum, uncounted_sum = comm[comm["reduction"] == "sum"]["step_time_vs_local_uncontrolled"]
    # sum's time is (1 + 0.02 * 5) / (1 + 0.02 * 2) of local's at the same factor; the counted local's average factor is 1.1.
    assert counted_sum == pytest.approx(1.10 / 1.04 / 1.1, rel=0.03)
    assert uncounted_sum == pytest.approx(1.10 / 1.04, rel=0.03)


def test_moving_blocks_are_runs_of_consecutive_steps():
    index = moving_blocks(100, 5, np.random.default_rng(0), resamples=50)
    assert index.shape == (50, 100) and index.min() >= 0 and index.max() < 100
    blocks = index[:, :100].reshape(50, 20, 5)
    assert (np.diff(blocks, axis=2) == 1).all()


def test_paired_measurement_recovers_overheads_through_a_load_change(tmp_path):
    job = write_cost_job(
        tmp_path / "cost", {"sum": 1.08, "detached": 1.0, "fsdp_sum": 1.0, "scaled": 1.0}, drift_from=70
    )
    table = cost_table(pd.DataFrame([{"path": str(job), "job": "cost", "world_size": 2, "sp": 1, "grad_accum": 2}]))
    rows = table.set_index("mode")
    for null in ("fsdp_sum", "scaled"):
        assert rows.loc[null, "role"] == "null control"
        assert rows.loc[null, "ci_low"] <= 1 <= rows.loc[null, "ci_high"] and rows.loc[null, "verdict"] == "null: holds"
    assert rows.loc["sum", "ci_low"] <= 1.08 <= rows.loc["sum", "ci_high"]
    assert rows.loc["sum", "verdict"] == "resolved"
    assert rows.loc["detached", "verdict"] == "not resolved"
    # The floor: sum adds 2 differentiable pairs (1 ms each) and drops a functional one (0.2 ms).
    assert rows.loc["sum", "predicted_extra_ms"] == pytest.approx(2 * 1.0 - 0.2)
    assert rows.loc["sum", "extra_calls"] == "-1 functional, +2 differentiable"
    # The extra time is paired: 8% of local's 30 ms before the load, of 90 ms after.
    assert 0.08 * 30 < rows.loc["sum", "extra_ms"] < 0.08 * 90


def test_a_null_control_that_excludes_one_withholds_every_cost(tmp_path):
    job = write_cost_job(tmp_path / "cost", {"sum": 1.2, "fsdp_sum": 1.05, "scaled": 1.0}, noise=0.01)
    table = cost_table(pd.DataFrame([{"path": str(job), "job": "cost", "world_size": 2, "sp": 1, "grad_accum": 2}]))
    rows = table.set_index("mode")
    assert rows.loc["fsdp_sum", "verdict"] == "null: differs"
    assert rows.loc["sum", "verdict"] == "null control failed"


def test_block_bootstrap_is_wider_than_iid_on_correlated_steps():
    rng = np.random.default_rng(1)
    n = 300
    drift = np.repeat(rng.normal(0, 0.05, size=n // 30), 30)  # load that holds for 30 steps at a time
    times = pd.DataFrame({"local": 0.03 * np.ones(n), "scaled": 0.03 * (1 + drift + 0.005 * rng.normal(size=n))})
    times.index += 1
    table = paired_overheads(times, warmup_steps=0)
    iid = np.median(np.stack([rng.choice(times["scaled"] / times["local"], n) for _ in range(2000)]), axis=1)
    iid_width = np.subtract(*np.percentile(iid, [97.5, 2.5]))
    assert (table["ci_high"] - table["ci_low"]).iloc[0] > iid_width


def test_report_states_the_interleaved_cost_with_its_null_control(tmp_path):
    layout = dict(world_size=2, grad_accum=2)
    sweep = write_sweep(
        tmp_path / "sweep", [SyntheticRun("sum", **layout), SyntheticRun("local", factor=0.5, **layout)]
    )
    write_cost_job(sweep / "cost", {"sum": 1.08, "detached": 1.0, "fsdp_sum": 1.0, "scaled": 1.0})
    result = analyze([sweep], sweep / "analysis", wandb_mode="disabled", make_plots=True)
    assert len(result.runs) == 2  # the cost job is not a run to compare
    assert (sweep / "analysis" / "cost.csv").exists() and (sweep / "analysis" / "interleaved_cost.png").exists()
    assert "the null control holds (`fsdp_sum` " in result.answer
    assert "`sum` costs +2." in result.answer and "`detached` costs at most +" in result.answer


def correlated_load(steps: int, rng: np.random.Generator) -> np.ndarray:
    """A load factor that wanders over tens of steps (AR(1), correlation 0.95 step to step) and jumps once."""
    walk = np.zeros(steps)
    for t in range(1, steps):
        walk[t] = 0.95 * walk[t - 1] + 0.05 * rng.standard_normal()
    return np.exp(walk) * np.where(np.arange(steps) >= steps // 2, 2.0, 1.0)


def test_the_exact_test_keeps_its_level_and_its_ci_covers_under_correlated_load(tmp_path):
    """200 synthetic cost jobs with correlated load, a cold first arm and heavy noise: the null arms are told
    apart from local in about 5 % of the jobs (Holm: any of them), and the CI of a 3 % cost holds 1.03 in
    about 95 %."""
    rng = np.random.default_rng(7)
    false_alarms, covered, resolved, jobs = 0, 0, 0, 200
    for draw in range(jobs):
        job = write_cost_job(
            tmp_path / f"cost{draw}", {"sum": 1.03, "fsdp_sum": 1.0, "scaled": 1.0}, steps=120, noise=0.05,
            seed=draw, load=correlated_load(120, rng), first_arm_penalty=0.1,
        )  # fmt: skip
        frame = pd.DataFrame([{"path": str(job), "job": "c", "world_size": 2, "sp": 1, "grad_accum": 2}])
        rows = cost_table(frame).set_index("mode")
        false_alarms += (rows.loc[["fsdp_sum", "scaled"], "verdict"] == "null: differs").any()
        covered += rows.loc["sum", "ci_low"] <= 1.03 <= rows.loc["sum", "ci_high"]
        resolved += rows.loc["sum", "verdict"] == "resolved"
    assert false_alarms / jobs <= 0.08  # at most 5 % in expectation (Holm), with room for 200 draws' chance
    assert 0.90 <= covered / jobs <= 0.99  # 95 % CIs, per comparison
    assert resolved / jobs >= 0.7  # and a 3 % cost is found in most jobs of 120 steps despite 5 % noise


def test_a_cost_job_too_short_to_compare_says_how_many_steps_it_needs(tmp_path):
    from analysis.cost.interleaved import MIN_STEPS
    from analysis.testing.synthetic import SyntheticRun, write_cost_job, write_sweep

    # 10 steps, 5 of warm-up: 5 left, one short of MIN_STEPS, beside a sweep and alone
    sweep = write_sweep(tmp_path / "sweep", [SyntheticRun("sum"), SyntheticRun("local", factor=0.5)])
    write_cost_job(sweep / "cost", {"local": 1.0, "sum": 1.2}, steps=10)
    said = (
        f"holds 5 steps after its warm-up of 5 (cost.warmup_steps), and comparing the modes needs {MIN_STEPS}: "
        "rerun it with train.steps=11 or more"
    )
    beside = analyze([sweep], tmp_path / "out", make_plots=False, wandb_mode="disabled")
    section = beside.report.read_text().split("## Cost, measured interleaved", 1)[1]
    assert said in section and "holds no interleaved cost job" not in section
    alone = analyze([sweep / "cost"], tmp_path / "alone", make_plots=False, wandb_mode="disabled")
    assert said in alone.answer and "(4 after warm-up at least)" not in alone.answer


def test_a_rules_own_loss_all_reduces_are_counted_apart_from_the_runners(tmp_path):
    from analysis.testing.synthetic import SyntheticRun, write_sweep

    custom = {"custom.fn": "my_trainers:counts_twice", "custom.name": "counts twice"}
    runs = [
        SyntheticRun("sum"),
        SyntheticRun("local"),
        SyntheticRun("custom", overrides=custom),  # the runner's two alone: N and the logged loss
        SyntheticRun("custom", overrides={**custom, "custom.name": "own two"}, own_loss_calls=3),
    ]
    loaded = load_sweeps([write_sweep(tmp_path / "sweep", runs)])
    comm = comm_table(assign_groups(loaded.runs).reset_index(drop=True), loaded.steps).set_index("reduction")
    assert comm.loc["local", ["loss_all_reduce_calls", "own_loss_all_reduce_calls"]].tolist() == [2, 0]
    assert comm.loc["counts twice [FSDP mean]", "own_loss_all_reduce_calls"] == 0
    assert comm.loc["own two [FSDP mean]", ["loss_all_reduce_calls", "own_loss_all_reduce_calls"]].tolist() == [4, 2]
