"""The analysis on synthetic sweeps whose answers are known by construction (analysis.testing.synthetic)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.__main__ import main as analysis_main
from analysis.gradients.tolerances import Tolerances
from analysis.gradients.verdicts import factor_label
from analysis.pipeline import analyze
from analysis.testing.synthetic import SyntheticRun, true_trajectory, write_sweep

TURN = 0.1  # radians: the mean_of_means stand-in's change of direction


def mixed_runs() -> list[SyntheticRun]:
    """Group seed 0 (W=2, GA=2): one run per verdict. Group seed 1: runs of different lengths and a failure."""
    layout = dict(world_size=2, grad_accum=2)
    return [
        SyntheticRun("sum", **layout),
        SyntheticRun("fsdp_sum", factor=1 + 1e-7, **layout),
        SyntheticRun("local", factor=0.5, **layout),
        SyntheticRun("detached", factor=0.5, loss_shift_from=12, **layout),
        SyntheticRun("mean_of_means", turn=TURN, **layout),
        SyntheticRun("scaled", status="diverged", diverge_at=7, **layout),
        SyntheticRun("sum", seed=1, **layout),
        SyntheticRun("local", seed=1, steps=40, factor=0.5, **layout),
        SyntheticRun("fsdp_sum", seed=1, status="failed", fail_after=3, **layout),
        SyntheticRun("scaled", seed=1, status="failed", fail_after=0, **layout),  # died before its first step
    ]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    sweep = write_sweep(tmp_path_factory.mktemp("mixed") / "sweep", mixed_runs())
    result = analyze([sweep], sweep / "analysis", wandb_mode="disabled")
    return sweep, result, result.verdicts


def row(verdicts: pd.DataFrame, mode: str, seed: int = 0) -> pd.Series:
    chosen = verdicts[(verdicts["reduction"] == mode) & verdicts["job"].str.endswith(f"seed{seed}")]
    assert len(chosen) == 1
    return chosen.iloc[0]


def test_each_run_gets_the_verdict_and_numbers_it_was_built_with(mixed):
    _, _, verdicts = mixed
    assert row(verdicts, "sum")["verdict"] == "reference"
    fsdp = row(verdicts, "fsdp_sum")
    assert fsdp["verdict"] == "equivalent" and fsdp["factor"] == pytest.approx(1 + 1e-7, rel=1e-12)

    local = row(verdicts, "local")
    assert (local["verdict"], local["factor_label"], local["verdict_text"]) == ("rescaled", "1/2", "rescaled ×1/2")
    assert local["factor"] == pytest.approx(0.5, rel=1e-12)
    assert local["grad_norm_ratio_median"] == pytest.approx(0.5, rel=1e-12)
    assert local["loss_matches"] and math.isnan(local["first_step_beyond"])

    detached = row(verdicts, "detached")
    assert detached["verdict_text"] == "rescaled ×1/2" and not detached["loss_matches"]
    assert detached["first_step_beyond"] == 12
    # The shift grows by 0.01 a step from step 12 to step 60.
    assert detached["final_loss_diff"] == pytest.approx(0.01 * (60 - 12 + 1), rel=1e-9)
    assert detached["loss_max_abs_diff"] == pytest.approx(0.49, rel=1e-9)

    mom = row(verdicts, "mean_of_means")
    assert mom["verdict"] == "different"
    assert mom["sketch_cos_step1"] == pytest.approx(math.cos(TURN), abs=1e-12)
    assert mom["sketch_cos_min"] == pytest.approx(math.cos(TURN), abs=1e-12)


def test_a_diverged_run_is_failed_at_its_divergence_step(mixed):
    _, _, verdicts = mixed
    scaled = row(verdicts, "scaled")
    assert (scaled["status"], scaled["verdict"], scaled["diverged_at"]) == ("diverged", "failed", 7)
    assert scaled["first_step_beyond"] == 7  # its loss stops being finite there
    assert scaled["steps_compared"] == 7
    assert "at step 7" in scaled["reason"]


def test_runs_of_different_lengths_and_failed_runs(mixed):
    _, result, verdicts = mixed
    short = row(verdicts, "local", seed=1)
    assert short["steps_compared"] == 40 and short["verdict_text"] == "rescaled ×1/2"
    failed = row(verdicts, "fsdp_sum", seed=1)
    assert failed["verdict"] == "failed" and failed["steps_compared"] == 3
    assert result.runs.set_index("run").loc[failed["run"], "steps_logged"] == 3
    # Two groups: the seed separates them, the reduction does not.
    assert result.runs.groupby("seed")["group"].nunique().tolist() == [1, 1]
    assert result.runs["group"].nunique() == 2


def test_expected_behaviour_flags_exactly_the_failed_runs(mixed):
    _, _, verdicts = mixed
    flagged = set(verdicts.loc[~verdicts["as_expected"].astype(bool), "job"])
    failed = [row(verdicts, "scaled"), row(verdicts, "fsdp_sum", seed=1), row(verdicts, "scaled", seed=1)]
    assert flagged == {r["job"] for r in failed}


def test_runs_parquet_keeps_every_run_and_step(mixed):
    sweep, _, _ = mixed
    runs = pd.read_parquet(sweep / "analysis" / "runs.parquet")
    per_run = runs.groupby("job", observed=True)["step"].count()
    expected = {r.job_name: (r.diverge_at or (r.fail_after if r.status == "failed" else r.steps)) for r in mixed_runs()}
    assert {job.split("_", 1)[1]: n for job, n in per_run.items()} == expected
    # The run that logged no step still has its row (with no step), so nothing is lost.
    assert len(runs) == sum(expected.values()) + 1
    assert {"optim.lr", "model.d_model", "status", "loss", "sketch_0", "comm_all_reduce_calls"} <= set(runs.columns)
    assert set(runs["status"]) == {"completed", "diverged", "failed"}


def test_communication_table_counts_the_loss_collectives_and_gives_sequential_step_times_no_ci(mixed):
    _, result, _ = mixed
    comm = result.comm[result.comm["group"] == row(result.verdicts, "sum")["group"]].set_index("reduction")
    # grad_accum=2: N plus sum's 2 per micro-batch, detached's 1 per micro-batch, local's 1 per step.
    assert comm.loc["sum", "loss_all_reduce_calls"] == 1 + 4
    assert comm.loc["detached", "extra_loss_calls_vs_local"] == (1 + 2) - (1 + 1)
    assert comm.loc["sum", "total_calls"] == 6 + 6
    # Jobs run one after another: a ratio of step-time medians, named uncontrolled, and no interval around it.
    assert [c for c in comm.columns if "ci" in c.split("_") or "overhead" in c] == []
    ratio = comm["step_time_vs_local_uncontrolled"]
    assert ratio["local"] == 1
    # Built in: step time * (1 + 0.02 * loss calls), so sum's is 1.10/1.04 of local's, up to 5% noise.
    assert ratio["sum"] == pytest.approx(1.10 / 1.04, rel=0.05)
    assert ratio["sum"] == comm.loc["sum", "step_ms_median"] / comm.loc["local", "step_ms_median"]


def test_report_opens_with_the_answer_in_numbers(mixed):
    sweep, result, _ = mixed
    report = (sweep / "analysis" / "report.md").read_text()
    answer = report.split("## Verdicts")[0]
    assert "## Answer" in answer
    assert "`local`: the same direction (step-1 cosine 1.000000) scaled by ×1/2 at W=2 (= 1/W)" in answer
    assert "departs from step 12" in answer
    assert f"step-1 cosine {math.cos(TURN):.4f}" in answer
    assert "`sum` issues 3 more loss all-reduces per step than `local`" in answer
    for png in ("loss_curves", "loss_difference", "gradient_scale", "gradient_direction", "comm_overhead"):
        assert (sweep / "analysis" / f"{png}.png").stat().st_size > 10_000
        assert f"]({png}.png)" in report
    assert result.answer in report


def test_a_world_size_1_run_is_the_ground_truth_for_every_layout(tmp_path):
    runs = [SyntheticRun("sum", world_size=1)]
    for world in (2, 4):
        runs += [
            SyntheticRun("sum", world_size=world, factor=1 + 1e-8),
            SyntheticRun("local", world_size=world, factor=1 / world, loss_shift_from=20 + world),
        ]
    sweep = write_sweep(tmp_path / "sweep", runs)
    result = analyze([sweep], tmp_path / "out", wandb_mode="disabled", make_plots=False)
    verdicts = result.verdicts
    ground_truth = verdicts.loc[verdicts["world_size"] == 1, "run"].item()
    assert (verdicts["baseline"] == ground_truth).all()
    assert (verdicts["baseline_kind"] == "world_size=1 sum").all()
    assert verdicts.set_index(["reduction", "world_size"])["verdict_text"].to_dict() == {
        ("sum", 1): "reference",
        ("sum", 2): "equivalent",
        ("sum", 4): "equivalent",
        ("local", 2): "rescaled ×1/2",
        ("local", 4): "rescaled ×1/4",
    }
    assert result.verdicts["as_expected"].all()

    invariance = result.invariance.set_index(["reduction", "axis"])
    assert not invariance.loc[("sum", "world_size"), "changes"]
    assert invariance.loc[("sum", "world_size"), "max_rel_diff"] == 0  # the sketch changed, the loss did not
    assert invariance.loc[("local", "world_size"), "changes"]
    assert invariance.loc[("local", "world_size"), "first_step_beyond"] == 22


def test_several_sweeps_are_analysed_as_one(tmp_path):
    reference = write_sweep(tmp_path / "reference", [SyntheticRun("sum", world_size=1)])
    ablation = write_sweep(tmp_path / "ablation", [SyntheticRun("local", world_size=2, factor=0.5)])
    assert analysis_main([str(reference), str(ablation), "--check", "--no-plots", "--wandb", "disabled"]) == 0
    verdicts = pd.read_csv(reference / "analysis-combined" / "verdicts.csv")
    local = verdicts[verdicts["reduction"] == "local"].iloc[0]
    assert local["baseline"] == "reference/0_sum_ws1_sp1_ga1_seed0" and local["verdict_text"] == "rescaled ×1/2"


def test_jobs_that_never_ran_are_listed_not_judged(tmp_path, capsys):
    runs = [SyntheticRun("sum"), SyntheticRun("local", factor=0.5), SyntheticRun("scaled", sp=3, status="invalid")]
    sweep = write_sweep(tmp_path / "sweep", runs)
    assert analysis_main([str(sweep), "--check", "--no-plots", "--wandb", "disabled"]) == 0
    out = capsys.readouterr().out
    assert "check: 1 job(s) never ran (invalid or skipped); not judged" in out
    assert "check: all 2 verdicts are as expected" in out
    verdicts = pd.read_csv(sweep / "analysis" / "verdicts.csv").set_index("reduction")
    assert verdicts.loc["scaled", "verdict"] == "not run" and "sp=3 does not divide" in verdicts.loc["scaled", "reason"]


def test_check_exits_1_and_names_the_offending_runs(mixed, capsys):
    sweep, _, _ = mixed
    assert analysis_main([str(sweep), "--check", "--no-plots", "--wandb", "disabled"]) == 1
    out = capsys.readouterr().out
    assert "check FAILED: 3 verdict(s)" in out
    for job in ("scaled_ws2_sp1_ga2_seed0", "fsdp_sum_ws2_sp1_ga2_seed1", "scaled_ws2_sp1_ga2_seed1"):
        assert job in out


def test_a_job_still_running_or_dead_without_summary_is_unfinished(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", [SyntheticRun("sum"), SyntheticRun("local", factor=0.5)])
    (next(sweep.glob("1_local*")) / "summary.json").unlink()
    verdicts = analyze([sweep], tmp_path / "out", wandb_mode="disabled", make_plots=False).verdicts.set_index(
        "reduction"
    )
    assert (verdicts.loc["local", "status"], verdicts.loc["local", "verdict"]) == ("unfinished", "failed")
    assert verdicts.loc["local", "factor"] == pytest.approx(0.5)  # what it logged is still measured


def test_tolerances_decide_the_verdict(tmp_path):
    """A 1e-3 scale change is `rescaled` at the default tolerance and `equivalent` at a looser one."""
    sweep = write_sweep(tmp_path / "sweep", [SyntheticRun("sum"), SyntheticRun("scaled", factor=1 + 1e-3)])
    strict = analyze([sweep], tmp_path / "strict", wandb_mode="disabled", make_plots=False).verdicts
    loose = analyze(
        [sweep], tmp_path / "loose", Tolerances(scale_rtol=1e-2), wandb_mode="disabled", make_plots=False
    ).verdicts
    assert strict.set_index("reduction").loc["scaled", "verdict"] == "rescaled"
    assert loose.set_index("reduction").loc["scaled", "verdict"] == "equivalent"


def test_synthetic_trajectory_and_factor_labels():
    first, again = true_trajectory(0, 10), true_trajectory(0, 10)
    assert np.array_equal(first["sketch"], again["sketch"])
    labels = [factor_label(k) for k in (0.5, 0.25 + 1e-7, 1 / 3, 2.0, 0.8173, 0.50002, float("nan"))]
    assert labels == ["1/2", "1/4", "1/3", "2", "0.8173", "0.50002", ""]


def test_bad_arguments_are_named_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        analysis_main([str(tmp_path / "missing")])
    assert exit_info.value.code == 2
    assert "sweep directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        analysis_main([str(tmp_path), "--loss-rtol", "0"])
    assert "--loss-rtol must be > 0" in capsys.readouterr().err
    assert analysis_main([str(tmp_path)]) == 2  # exists, but holds no job directory
    assert "no job directories" in capsys.readouterr().err


def test_broken_jobs_are_reported_not_fatal(tmp_path):
    """A corrupt config.yaml, a cut-off metrics line and a sweep where nothing logged a step."""
    sweep = write_sweep(
        tmp_path / "sweep", [SyntheticRun("sum"), SyntheticRun("local", factor=0.5), SyntheticRun("scaled")]
    )
    (next(sweep.glob("2_scaled*")) / "config.yaml").write_text("reduction: [unclosed\n")
    metrics = next(sweep.glob("1_local*")) / "metrics.jsonl"
    metrics.write_text(metrics.read_text()[:-40])  # the last record cut mid-line, as by a killed rank
    verdicts = analyze([sweep], tmp_path / "out", wandb_mode="disabled").verdicts
    broken = verdicts[verdicts["job"].str.startswith("2_")].iloc[0]
    assert broken["verdict"] == "failed" and "config.yaml is unreadable" in broken["reason"]
    local = verdicts.set_index("reduction").loc["local"]
    assert local["steps_compared"] == 59 and local["verdict_text"] == "rescaled ×1/2"

    nothing = write_sweep(tmp_path / "nothing", [SyntheticRun("sum", status="failed", fail_after=0)])
    result = analyze([nothing], tmp_path / "out2", wandb_mode="disabled")
    assert result.verdicts["verdict"].tolist() == ["failed"]
    assert "## Answer" in result.report.read_text()


def test_group_labels_name_the_layout_and_the_other_swept_values(tmp_path):
    runs = [
        SyntheticRun(mode, world_size=w, overrides={"optim.name": opt})
        for mode in ("sum", "local")
        for w in (1, 2)
        for opt in ("adamw", "sgd")
    ]
    sweep = write_sweep(tmp_path / "sweep", runs)
    verdicts = analyze([sweep], tmp_path / "out", wandb_mode="disabled", make_plots=False).verdicts
    assert sorted(set(verdicts["group_label"])) == [
        "DP(1)-SP(1)-GA(1) optim.name=adamw",
        "DP(1)-SP(1)-GA(1) optim.name=sgd",
        "DP(2)-SP(1)-GA(1) optim.name=adamw",
        "DP(2)-SP(1)-GA(1) optim.name=sgd",
    ]
    assert verdicts["baseline_kind"].eq("world_size=1 sum").all()


def test_a_label_names_a_model_by_its_preset_not_by_the_keys_the_preset_sets(tmp_path):
    """model=tiny,hf_llama: `model.name` tells `model.arch` and the HF config keys (unset for the own decoder)."""
    hf_llama = {
        "model.name": "hf_llama",
        "model.arch": "hf",
        "model.overrides": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
    }
    runs = [SyntheticRun(mode, overrides=model) for mode in ("sum", "local") for model in ({}, hf_llama)]
    verdicts = analyze(
        [write_sweep(tmp_path / "sweep", runs)], tmp_path / "out", wandb_mode="disabled", make_plots=False
    ).verdicts
    assert sorted(set(verdicts["group_label"])) == [
        "DP(2)-SP(1)-GA(1) model.name=hf_llama",
        "DP(2)-SP(1)-GA(1) model.name=tiny",
    ]


def test_a_run_with_dropout_is_judged_against_its_own_layouts_sum():
    """Layouts draw different dropout masks (runner.train.rng): a run whose model has dropout never takes the
    family's world_size=1 run as its baseline, only its own layout's `sum`; runs without dropout still do."""
    from analysis.gradients.groups import _baselines

    rows = []
    for dropout in (None, "attention_dropout=0.1"):
        family = "f1" if dropout is None else "f2"
        for world_size, reduction in ((1, "sum"), (2, "sum"), (2, "local")):
            rows.append(
                {
                    "run": f"{family}/w{world_size}_{reduction}",
                    "status": "completed",
                    "reduction": reduction,
                    "world_size": world_size,
                    "grad_accum": 2,
                    "sp": 1,
                    "group": f"{family}/w{world_size}",
                    "family": family,
                    "dropout": dropout,
                }
            )
    runs = pd.DataFrame(rows)
    baseline, kind = _baselines(runs)
    got = dict(zip(runs["run"], zip(baseline, kind)))
    assert got["f1/w2_local"] == ("f1/w1_sum", "world_size=1 sum")
    assert got["f2/w2_local"] == ("f2/w2_sum", "group sum (dropout: layouts draw their own masks)")
    assert got["f2/w1_sum"] == ("f2/w1_sum", "group sum (dropout: layouts draw their own masks)")
