"""The analysis with `pp` (pipeline stages) a layout axis as `tp` is, on synthetic sweeps whose answers are known
by construction: W, the ranks the loss is reduced over, is the data ranks world_size / (tp x pp), so `local` at
world_size=4 pp=2 is expected at grad L / 2; a config written before the key reads as pp=1. (The tp checks beside
them: tests/test_tensor_parallel_sweep.py runs them end to end.)"""

from __future__ import annotations

import csv
import dataclasses

import pandas as pd
import pytest
import yaml

from analysis.cost.interleaved import cost_table
from analysis.gradients.groups import LAYOUT, assign_groups
from analysis.gradients.tolerances import Tolerances
from analysis.load.sweeps import load_sweeps
from analysis.pipeline import analyze
from analysis.plots import cost as plots_cost
from analysis.plots.curves import reference_levels
from analysis.post_training.expectations import expected_change
from analysis.post_training.layouts import layout_table
from analysis.report.answer import _tensor_parallel_note
from analysis.report.cost import cost_answer
from analysis.testing.synthetic import SyntheticRun, pg_run, write_cost_job, write_sweep
from runner.modes import OVER_W
from runner.record.config_file import write_config_copy

PP_SENTENCE = "W below counts the data ranks, world_size / pp"  # pp alone
BOTH_SENTENCE = "W below counts the data ranks, world_size / (tp x pp)"
TP_SENTENCE = "W below counts the data ranks, world_size / tp: the tp ranks of a tensor-parallel group"


def _analyze(tmp_path, runs):
    sweep = write_sweep(tmp_path / "sweep", runs)
    return analyze([sweep], tmp_path / "out", wandb_mode="disabled", make_plots=False)


# (world_size, overrides, the layout's name, the data ranks)
SPLITS = [
    (4, {"tp": 2}, "DP(2)-SP(1)-TP(2)-GA(1)", 2),
    (4, {"pp": 2}, "DP(2)-SP(1)-PP(2)-GA(1)", 2),
    (4, {"pp": 2, "pp_schedule": "1f1b"}, "DP(2)-SP(1)-PP(2)-GA(1)", 2),
    (8, {"tp": 2, "pp": 2}, "DP(2)-SP(1)-TP(2)-PP(2)-GA(1)", 2),
    (8, {"pp": 2}, "DP(4)-SP(1)-PP(2)-GA(1)", 4),
]


@pytest.mark.parametrize("world, split, layout, ranks", SPLITS)
def test_local_is_expected_rescaled_by_one_over_the_data_ranks(tmp_path, world, split, layout, ranks):
    """`sum` at the split layout equivalent to the W=1 ground truth of its family, `local` rescaled ×1/(W/(tp x pp))
    and as expected; verdicts.csv names tp, pp and the schedule beside the layout."""
    schedule = {"pp_schedule": split["pp_schedule"]} if "pp_schedule" in split else None
    runs = [
        SyntheticRun("sum", world_size=1, overrides=schedule),
        SyntheticRun("sum", world_size=world, factor=1 + 1e-8, overrides=split),
        SyntheticRun("local", world_size=world, factor=1 / ranks, loss_shift_from=30, overrides=split),
    ]
    verdicts = _analyze(tmp_path, runs).verdicts
    assert verdicts["family"].nunique() == 1
    ground_truth = verdicts.loc[verdicts["world_size"] == 1, "run"].item()
    assert (verdicts["baseline"] == ground_truth).all()
    local = verdicts[verdicts["reduction"] == "local"].iloc[0]
    assert local["layout"] == layout
    assert local["expected"] == local["verdict_text"] == f"rescaled ×1/{ranks}" and local["as_expected"]
    assert verdicts["as_expected"].all()
    with (tmp_path / "out" / "verdicts.csv").open() as f:
        rows = {row["reduction"]: row for row in csv.DictReader(f)}
    header = list(rows["local"])
    assert header.index("pp") == header.index("tp") + 1 and header.index("pp_schedule") == header.index("pp") + 1
    assert (rows["local"]["tp"], rows["local"]["pp"]) == (str(split.get("tp", 1)), str(split.get("pp", 1)))
    assert rows["local"]["pp_schedule"] == split.get("pp_schedule", "gpipe")
    assert float(rows["local"]["data_ranks"]) == ranks


def test_a_gradient_averaged_over_all_ranks_under_pp_is_not_as_expected(tmp_path):
    """At world_size=4 pp=2, `local` is expected at grad L / 2 (the data ranks), so a run at grad L / 4, a mean
    that counted the stages as data ranks, is flagged."""
    runs = [
        SyntheticRun("sum", world_size=4, overrides={"pp": 2}),
        SyntheticRun("local", world_size=4, factor=1 / 4, overrides={"pp": 2}),
    ]
    local = _analyze(tmp_path, runs).verdicts.set_index("reduction").loc["local"]
    assert local["expected"] == "rescaled ×1/2"
    assert local["verdict_text"] == "rescaled ×1/4" and not local["as_expected"]


def test_pp_is_an_invariance_axis_and_a_column_of_comm_csv(tmp_path):
    runs = [SyntheticRun("sum", world_size=2)]
    runs += [SyntheticRun("sum", world_size=4, overrides={"pp": pp}) for pp in (1, 2)]
    result = _analyze(tmp_path, runs)
    assert "pp" in LAYOUT
    invariance = result.invariance.set_index(["reduction", "axis"])
    assert invariance.loc[("sum", "pp"), "values"] == "1,2" and not invariance.loc[("sum", "pp"), "changes"]
    comm = pd.read_csv(tmp_path / "out" / "comm.csv")
    columns = list(comm.columns)
    assert columns.index("pp") == columns.index("tp") + 1 and columns.index("pp_schedule") == columns.index("pp") + 1
    assert sorted(comm["pp"]) == [1, 1, 2] and set(comm["pp_schedule"]) == {"gpipe"}


def _strip_pipeline_keys(job) -> None:
    """config.yaml as a runner before pipeline parallelism wrote it: no pp* keys (and its JSON copy to match)."""
    path = job / "config.yaml"
    path.write_text("".join(line for line in path.read_text().splitlines(keepends=True) if not line.startswith("pp")))
    write_config_copy(path)


def test_configs_without_pp_read_as_one_stage_beside_newer_ones(tmp_path):
    """Older runs (no pp, pp_schedule, pp_microbatches, pp_scale_grads in config.yaml) beside a newer pp=2 run:
    pp reads as 1 and the schedule as the default, so they keep their family and group, and their layout is named
    without PP."""
    runs = [
        SyntheticRun("sum", world_size=1),
        SyntheticRun("sum", world_size=2),
        SyntheticRun("local", world_size=2, factor=1 / 2),
        SyntheticRun("local", world_size=4, factor=1 / 2, overrides={"pp": 2}),
    ]
    sweep = write_sweep(tmp_path / "sweep", runs)
    older = sorted(sweep.glob("[012]_*"))
    for job in older:
        _strip_pipeline_keys(job)
    assert not any(key.startswith("pp") for job in older for key in yaml.safe_load((job / "config.yaml").read_text()))
    loaded = load_sweeps([sweep])
    assert loaded.runs["pp"].tolist() == [1, 1, 1, 2] and loaded.runs["pp"].dtype.kind == "i"
    assert set(loaded.runs["pp_schedule"]) == {"gpipe"} and set(loaded.runs["pp_scale_grads"]) == {False}
    grouped = assign_groups(loaded.runs)
    assert grouped["family"].nunique() == 1
    assert grouped["layout"].tolist() == [
        "DP(1)-SP(1)-GA(1)",
        "DP(2)-SP(1)-GA(1)",
        "DP(2)-SP(1)-GA(1)",
        "DP(2)-SP(1)-PP(2)-GA(1)",
    ]
    assert grouped.loc[1, "group"] == grouped.loc[2, "group"]  # the older sum and local: one comparison group
    assert grouped["data_ranks"].tolist() == [1, 2, 2, 2]
    verdicts = analyze([sweep], tmp_path / "out", wandb_mode="disabled", make_plots=False).verdicts
    assert verdicts["as_expected"].all()
    assert (verdicts["baseline"] == verdicts.loc[0, "run"]).all()


def test_a_sweep_of_older_configs_alone_reads_pp_as_one(tmp_path):
    runs = [SyntheticRun("sum", world_size=1), SyntheticRun("local", world_size=2, factor=1 / 2)]
    sweep = write_sweep(tmp_path / "sweep", runs)
    for job in sweep.glob("*_*"):
        _strip_pipeline_keys(job)
    result = analyze([sweep], tmp_path / "out", wandb_mode="disabled", make_plots=False)
    assert result.verdicts["pp"].tolist() == [1, 1] and set(result.verdicts["pp_schedule"]) == {"gpipe"}
    assert result.verdicts["data_ranks"].tolist() == [1, 2] and result.verdicts["as_expected"].all()
    assert "W below counts" not in (tmp_path / "out" / "report.md").read_text()


def test_the_answer_says_what_w_counts_under_pipeline_parallelism(tmp_path):
    runs = [
        SyntheticRun("sum", world_size=1),
        SyntheticRun("local", world_size=4, factor=1 / 2, overrides={"pp": 2}),
    ]
    _analyze(tmp_path, runs)
    report = (tmp_path / "out" / "report.md").read_text()
    assert PP_SENTENCE + ": the pp stages of a pipeline hold the same tokens" in report
    assert TP_SENTENCE not in report


@pytest.mark.parametrize(
    "tp, pp, sentence",
    [
        ([1, 1], [1, 1], None),
        ([1, 2], [1, 1], TP_SENTENCE),  # tensor parallelism alone: the wording it had
        ([1, 1], [1, 2], PP_SENTENCE + ": the pp stages of a pipeline hold"),
        ([1, 2], [1, 2], BOTH_SENTENCE + ": the tp ranks of a tensor-parallel group and the pp stages of a pipeline"),
        ([2, 1], [1, 2], BOTH_SENTENCE + ": the tp ranks of a tensor-parallel group and the pp stages of a pipeline"),
    ],
)
def test_the_w_sentence_names_the_axes_that_ran(tp, pp, sentence):
    note = _tensor_parallel_note(pd.DataFrame({"tp": tp, "pp": pp}))
    assert (note == "") if sentence is None else (sentence in note), note
    assert _tensor_parallel_note(pd.DataFrame({"world_size": [4]})) == ""  # a table without tp or pp


def test_the_cost_answer_and_plot_name_the_pipeline_layout(tmp_path, monkeypatch):
    job = write_cost_job(tmp_path / "cost", {"sum": 1.2, "fsdp_sum": 1.0}, noise=0.01, world_size=4)
    config = {"path": str(job), "job": "cost", "world_size": 4, "sp": 1, "grad_accum": 2}
    older = cost_table(pd.DataFrame([config]))
    assert set(older["pp"]) == {1} and " at DP(4)-SP(1)-GA(2) over " in cost_answer(older)
    table = cost_table(pd.DataFrame([{**config, "tp": 2, "pp": 2}]))
    assert set(table["pp"]) == {2} and list(table.columns).index("pp") == list(table.columns).index("tp") + 1
    answer = cost_answer(table)  # every mode resolved: no "at most" clause (it raised before, with none to list)
    assert " at DP(1)-SP(1)-TP(2)-PP(2)-GA(2) over " in answer and "at most" not in answer
    assert answer.startswith("Does a mode take more or less time a step than `local`? Yes, `sum` takes ")

    titles = []

    def saving(fig, path, dpi=100):
        titles.extend(ax.get_title() for ax in fig.axes)
        return path

    monkeypatch.setattr(plots_cost, "save", saving)
    plots_cost.interleaved_cost(table.assign(tp=1), tmp_path)
    plots_cost.interleaved_cost(table, tmp_path)
    plots_cost.interleaved_cost(older.drop(columns=["tp", "pp"]), tmp_path)
    assert [t.split(":")[0] for t in titles] == [
        "W=4, sp=1, GA=2, pp=2",
        "W=4, sp=1, GA=2, tp=2, pp=2",
        "W=4, sp=1, GA=2",
    ]


def test_the_scale_curves_reference_line_names_the_data_ranks():
    assert reference_levels("sketch_scale", 4.0)[1][1] == "1/W = 1/4"
    assert reference_levels("sketch_scale", 2.0, tp=2)[1][1] == "1/(W/tp) = 1/2"
    assert reference_levels("sketch_scale", 2.0, pp=2)[1][1] == "1/(W/pp) = 1/2"
    assert reference_levels("sketch_scale", 2.0, tp=2, pp=2)[1][1] == "1/(W/(tp x pp)) = 1/2"
    assert reference_levels("sketch_scale", 1.0, pp=2) == [(1.0, "1 (the baseline's)")]


def test_post_training_counts_dp_without_the_stages(tmp_path):
    """A rule stated `x dp` at world_size=4 pp=2 (dp=2) is expected at 2 x its W=1 gradient, and rl's dp is 2."""
    w1 = pg_run("sum over dp", "w1", "token", "x dp")
    piped = dataclasses.replace(
        pg_run("sum over dp", "w2", "token", "x dp", factor=2), world_size=4, overrides={**w1.overrides, "pp": 2}
    )
    runs = [SyntheticRun("sum", 1, steps=3, overrides={"objective.name": "pg"}), w1, piped]
    loaded = load_sweeps([write_sweep(tmp_path / "sweep", runs)])
    table = layout_table(assign_groups(loaded.runs).reset_index(drop=True), loaded.steps, Tolerances())
    row = table[table["layout"] == "DP(2)-SP(1)-PP(2)-GA(1)"].iloc[0]
    assert row["dp"] == 2 and row["scale"] == pytest.approx(2) and bool(row["as_expected"])
    over_w = {"gradient": OVER_W, "world_size": 8, "sp": 1, "grad_accum": 1}
    assert expected_change(pd.Series({**over_w, "tp": 2, "pp": 2})) == 1 / 2
    assert expected_change(pd.Series({**over_w, "pp": 2})) == 1 / 4
    assert expected_change(pd.Series(over_w)) == 1 / 8  # a row of a config without tp or pp
    assert expected_change(pd.Series({**over_w, "pp": float("nan")})) == 1 / 8
