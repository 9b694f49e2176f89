"""The analysis of trainers, other all-reduces and custom callables, on synthetic sweeps with known answers.

`autograd_all_reduce` and `custom.*` make a run's mode, not its group: a `sum[identity]` run and custom
runs land in the reference's group, and the baseline is the funcol `sum` run. A custom run is judged by
what it measured, against `custom.expect` when given; without it, it is not judged.
"""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.__main__ import main as analysis_main
from analysis.gradients.groups import assign_groups
from analysis.gradients.measures import measure
from analysis.gradients.tolerances import Tolerances
from analysis.load.sweeps import load_sweeps
from analysis.pipeline import analyze
from analysis.plots import curves as curve_plots
from analysis.plots.figures import legibility_problems, save
from analysis.testing.synthetic import SyntheticRun, write_sweep

LAYOUT = dict(world_size=2, grad_accum=2)


def custom(name: str, fsdp: str = "mean", expect: str | None = None, named: bool = True, **changes) -> SyntheticRun:
    """A custom rule my_trainers:NAME; `named`: with custom.name NAME (the trainers' presets name theirs)."""
    overrides = {"custom.fn": f"my_trainers:{name}", "custom.fsdp_reduce": fsdp, "custom.rule": f"rule of {name}"}
    if named:
        overrides["custom.name"] = name
    if expect is not None:
        overrides["custom.expect"] = expect
    return SyntheticRun("custom", overrides=overrides, **LAYOUT, **changes)


def backward(implementation: str, per_rank: list[float]) -> dict:
    """summary.json's `all_reduce_backward` as a run measures it (runner.train.all_reduce.measured_backward)."""
    return {
        "all_reduce_backward": {
            "implementation": implementation,
            "factor": per_rank[0],
            "per_rank": per_rank,
            "torch": "2.13.0+cpu",
        }
    }


TITAN = {"package": "torchtitan", "version": "0.3.0", "calls": ["torchtitan.components.loss.CrossEntropyLoss"]}
HF = {"package": "transformers", "version": "5.25.0", "calls": ["transformers.loss.loss_utils.ForCausalLMLoss"]}
HF["follows"] = ["transformers/trainer.py: Trainer.compute_loss"]
MEGATRON = {
    "repository": "NVIDIA/Megatron-LM",
    "commit": "d98e8a64ddf34856e74b24714e3bedb2f5a39553",
    "files": ["pretrain_gpt.py: loss_func", "megatron/core/pipeline_parallel/schedules.py: forward_step"],
}


def trainer_runs() -> list[SyntheticRun]:
    """`sum` and `sum[identity]` record their measured backward as the runner does (the synthetic sweep writes it)."""
    return [
        SyntheticRun("sum", **LAYOUT),
        SyntheticRun("sum", overrides={"autograd_all_reduce": "identity"}, factor=0.5, loss_shift_from=12, **LAYOUT),
        SyntheticRun(  # an earlier runner's record: no measured backward
            "sum", overrides={"autograd_all_reduce": "torch_nn"}, **LAYOUT, summary={"all_reduce_backward": None}
        ),
        SyntheticRun("local", factor=0.5, loss_shift_from=12, **LAYOUT),
        custom("titan", fsdp="sum", expect="grad L", factor=1 + 1e-7, summary={"custom_upstream": [TITAN]}),
        custom(
            "titan",
            fsdp="mean",
            expect="grad L / W",
            factor=0.5,
            loss_shift_from=12,
            summary={"custom_upstream": [TITAN]},
        ),  # one callable under another FSDP reduction
        custom("hf", expect="grad L", own_all_gathers=1, summary={"custom_upstream": [HF]}),  # the token count's
        custom(
            "per_rank_mean",
            expect="different",
            turn=0.05,
            loss_shift_from=20,
            own_loss_calls=2,
            summary={"custom_upstream": [MEGATRON]},
        ),
        custom("doubled", expect="2", factor=2.0, own_loss_calls=3),
        custom("released", expect="grad L", own_loss_calls=1 + 2 * 2, summary=backward("torch_nn", [2.0, 2.0])),
        custom("rfc", expect="grad L / W", factor=0.5, reported_factor=0.5, loss_shift_from=12),  # logs L / W
        custom(
            "kept_under_sum",
            fsdp="sum",
            expect="grad L x W",
            factor=2.0,
            loss_shift_from=5,
            summary={**backward("torch_nn", [2.0, 2.0]), "custom_upstream": []},  # a construction of its own
        ),
        custom("unstated", factor=0.25, named=False),
        custom("wrongly_stated", expect="grad L / W"),
    ]


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    sweep = write_sweep(tmp_path_factory.mktemp("trainers") / "sweep", trainer_runs())
    result = analyze([sweep], sweep / "analysis", wandb_mode="disabled", make_plots=False)
    return sweep, result


def by_label(verdicts: pd.DataFrame) -> dict[str, pd.Series]:
    return {row["reduction"]: row for _, row in verdicts.iterrows()}


def label(name: str, fsdp: str = "mean") -> str:
    """The mode label of custom(name, fsdp) (`runner.modes.run_mode_label`)."""
    return f"{name} [FSDP {fsdp}]"


UNNAMED = "custom:my_trainers:unstated [FSDP mean]"  # no custom.name: the callable names it


def test_the_modes_keys_make_labels_not_groups_and_the_baseline_is_the_funcol_sum(analysed):
    _, result = analysed
    rows = by_label(result.verdicts)
    assert result.verdicts["group"].nunique() == 1
    reference = rows["sum"]
    assert reference["verdict"] == "reference"
    assert set(result.verdicts["baseline"]) == {reference["run"]}
    assert {"sum[identity]", "sum[torch_nn]", label("titan", "sum"), label("titan"), label("doubled"), UNNAMED} == (
        set(rows)
        - {"sum", "local", label("hf"), label("per_rank_mean"), label("wrongly_stated"), label("released")}
        - {label("rfc"), label("kept_under_sum", "sum")}
    )
    assert rows["sum[identity]"]["fsdp_reduction"] == "mean"
    # One callable under FSDP SUM and mean: two modes, each with its own gradient.
    assert (rows[label("titan", "sum")]["fsdp_reduction"], rows[label("titan")]["fsdp_reduction"]) == ("sum", "mean")
    assert (rows[label("titan", "sum")]["verdict_text"], rows[label("titan")]["verdict_text"]) == (
        "equivalent",
        "rescaled ×1/2",
    )
    assert "identity" in rows["sum[identity]"]["all_reduce"] and rows["local"]["all_reduce"] == ""


def test_identity_is_expected_to_rescale_by_1_over_W_and_torch_nn_to_be_grad_L(analysed):
    _, result = analysed
    rows = by_label(result.verdicts)
    identity = rows["sum[identity]"]
    assert (identity["verdict_text"], identity["expected"], identity["as_expected"]) == (
        "rescaled ×1/2",
        "rescaled ×1/2",
        True,
    )
    torch_nn = rows["sum[torch_nn]"]
    assert torch_nn["verdict"] == "identical" and torch_nn["expected"] == "equivalent" and torch_nn["as_expected"]


def test_custom_runs_get_their_measured_verdict_and_the_stated_expectation(analysed):
    _, result = analysed
    rows = by_label(result.verdicts)
    labels = {name: label(name) for name in ("hf", "per_rank_mean", "doubled", "wrongly_stated")}
    labels.update(titan=label("titan", "sum"), unstated=UNNAMED)
    judged = {name: (rows[labels[name]]["verdict_text"], rows[labels[name]]["expected"]) for name in labels}
    assert judged == {
        "titan": ("equivalent", "equivalent"),
        "hf": ("identical", "equivalent"),
        "per_rank_mean": ("different", "different"),
        "doubled": ("rescaled ×2", "rescaled ×2"),
        "unstated": ("rescaled ×1/4", "not judged (no custom.expect)"),  # measured all the same
        "wrongly_stated": ("identical", "rescaled ×1/2"),
    }
    as_expected = {name: rows[labels[name]]["as_expected"] for name in judged}
    assert as_expected["unstated"] is pd.NA
    assert {k: bool(v) for k, v in as_expected.items() if k != "unstated"} == {
        "titan": True,
        "hf": True,
        "per_rank_mean": True,
        "doubled": True,
        "wrongly_stated": False,
    }


def test_check_fails_on_a_wrong_expectation_only_and_says_what_each_all_reduce_does(analysed, capsys):
    sweep, _ = analysed
    assert analysis_main([str(sweep), "--check", "--no-plots", "--wandb", "disabled"]) == 1
    printed = capsys.readouterr().out
    assert "check FAILED: 1 verdict(s)" in printed and "wrongly_stated" in printed.split("check FAILED")[1]
    assert "check: 1 custom run(s) without custom.expect; not judged" in printed
    assert "check: `identity` all-reduces with SUM forward and passes the gradient through backward" in printed
    assert "check: `torch_nn` is `torch.distributed.nn.functional.all_reduce`" in printed


def test_trainers_table_and_sentences(analysed):
    sweep, result = analysed
    table = pd.read_csv(sweep / "analysis" / "trainers.csv")
    assert table["trainer"].tolist()[0] == "sum" and "local" not in set(
        table["trainer"]
    )  # the reference, then trainers
    rows = table.set_index("trainer")
    assert rows.loc["sum[identity]", "gradient vs grad L"] == "grad L × 1/2"
    assert not rows.loc["sum[identity]", "curves match"] and rows.loc[label("titan", "sum"), "curves match"]
    assert rows.loc[label("titan", "sum"), "rule"] == "rule of titan"
    assert rows.loc[label("doubled"), "factor"] == pytest.approx(2.0, rel=1e-12)
    assert rows.loc[label("titan"), "factor"] == pytest.approx(0.5, rel=1e-12)
    assert rows.loc[label("per_rank_mean"), "gradient vs grad L"].startswith("another direction")
    report = (sweep / "analysis" / "report.md").read_text()
    assert "## Trainers" in report
    assert (
        f"- `{label('doubled')}` (rule of doubled): grad L × 2, step-1 scale 2.000000; its loss curve matches "
        "the reference's; expected rescaled ×2: as expected." in result.answer
    )
    assert "- `sum[identity]` (sum: all-reduce of S/N with identity, identity backward, FSDP mean)" in result.answer


def test_the_trainers_table_says_what_code_ran_what_backward_was_measured_and_what_was_counted(analysed):
    sweep, _ = analysed
    rows = pd.read_csv(sweep / "analysis" / "trainers.csv").set_index("trainer")
    code = rows["code that ran"].to_dict()
    assert code[label("titan", "sum")] == code[label("titan")] == "torchtitan 0.3.0 (CrossEntropyLoss)"
    assert code[label("hf")] == "transformers 5.25.0 (ForCausalLMLoss)"
    assert code[label("per_rank_mean")] == "NVIDIA/Megatron-LM@d98e8a6 (pretrain_gpt.py, schedules.py)"
    assert code["sum"] == "the runner's own" and code[UNNAMED] == "not recorded (an earlier runner)"
    assert code[label("kept_under_sum", "sum")] == "no upstream (a rule of its own)"
    assert rows.loc[label("hf"), "code that ran (in full)"] == (
        "transformers 5.25.0: calls transformers.loss.loss_utils.ForCausalLMLoss; "
        "follows transformers/trainer.py: Trainer.compute_loss"
    )
    assert rows.loc[label("per_rank_mean"), "code that ran (in full)"].startswith(
        "NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553: pretrain_gpt.py: loss_func; "
    )
    measured = rows["all-reduce backward (measured)"].to_dict()
    assert measured["sum"] == "SUM (×2 on every rank, funcol, torch 2.13.0+cpu)"
    assert measured["sum[identity]"] == "identity (×1 on every rank, identity, torch 2.13.0+cpu)"
    assert measured[label("released")] == "SUM (×2 on every rank, torch_nn, torch 2.13.0+cpu)"
    assert measured["sum[torch_nn]"] == "not measured (an earlier runner)"
    assert measured[label("hf")] == "none declared"
    # Counted: N, the logged loss and a rule's own all-reduces; the HF token count's all-gather is another collective.
    calls = rows[["loss all-reduces / step", "other collectives vs local"]].astype(float)
    assert calls.loc["sum"].tolist() == [1 + 2 * 2, 0]  # N, and forward + backward per micro-batch (GA = 2)
    assert calls.loc[label("hf")].tolist() == [2, 1]  # local's two all-reduces, and one all-gather of its own
    assert calls.loc[label("per_rank_mean")].tolist() == [3, 0] and calls.loc[label("released")].tolist() == [6, 0]


def test_the_trainers_section_names_the_rules_whose_measured_backward_is_a_sum(analysed):
    sweep, _ = analysed
    report = (sweep / "analysis" / "report.md").read_text()
    sentence = next(line for line in report.splitlines() if line.startswith("The all-reduce in the loss's graph"))
    assert sentence.startswith(
        "The all-reduce in the loss's graph, its backward measured at each run's start (torch 2.13.0+cpu): "
    )
    assert (
        f"a SUM backward (each rank's loss receives W) in `sum`, `{label('kept_under_sum', 'sum')}` and "
        f"`{label('released')}`;" in sentence
    )
    assert "an identity backward (each rank's loss receives 1) in `sum[identity]`" in sentence
    assert "none in the graph (none measured, none declared) of `local`" not in sentence  # local is no trainer
    assert f"`{label('hf')}`" in sentence.split("none in the graph")[1] and "`sum[torch_nn]`" not in sentence


def rfc_points(answer: str) -> list[str]:
    """The RFC's points, in order: each numbered line after "**The RFC**"."""
    block = answer.split("**The RFC**", 1)[1].split("\n\n- ", 1)[0]
    return [line[3:] for line in block.splitlines() if line[:3] in ("1. ", "2. ", "3. ")]


def test_the_rfc_is_answered_point_by_point_yes_or_no_first_then_the_numbers(analysed):
    _, result = analysed
    local, all_reduce, logging = rfc_points(result.answer)
    assert local.startswith(
        "Can FSDP train with the local loss alone? Yes, but its gradient is grad L / W, not grad L: "
    )
    assert (
        f"`local`, `{label('rfc')}` and `{label('titan')}` (no all-reduce in the graph, FSDP's mean) measure a "
        "step-1 scale of ×0.500000 at W=2 (= 1/W) against the reference." in local
    )
    assert all_reduce.startswith(
        "Is the loss's differentiable all-reduce needed for grad L? Yes, where its backward is a SUM and FSDP takes "
        "the mean: measured with torch 2.13.0+cpu, the backward gives each rank's loss ×2 (= W) in "
        f"`sum` and `{label('released')}`, whose gradient is grad L; without it the gradient is grad L / W "
    )
    assert (
        "no with an identity backward (×1 measured in `sum[identity]`): it changes nothing, the gradient is "
        "grad L / W (step-1 scale ×0.500000 at W=2)" in all_reduce
    )
    assert (
        f"kept under FSDP SUM it gives W x grad L (`{label('kept_under_sum', 'sum')}`: ×2.000000 at W=2)" in all_reduce
    )
    assert (
        f"Which trainers need it: those whose rule has it in the graph under FSDP's mean (`sum` and "
        f"`{label('released')}`); the others get grad L without it, by FSDP SUM (`{label('titan', 'sum')}`) or by "
        f"W x loss under FSDP's mean (`{label('hf')}` and `{label('wrongly_stated')}`)." in all_reduce
    )
    assert "sum[torch_nn]" not in all_reduce  # its backward was not measured: not stated
    assert logging.startswith(
        "Is the engine's mean of the logged loss a second reduction of the gradient? No, it is logging only"
    )
    assert (
        f"Without the CE all-reduce it logs L / W: `{label('rfc')}` report L ×0.500000 at W=2 (= 1/W; reported loss "
        "over L, median over steps), while the gradient is scaled once, not twice (×0.500000 at W=2" in logging
    )


def test_each_rfc_point_says_not_measured_where_the_runs_do_not_show_it(tmp_path):
    """Only a reference and a rule that gives grad L: no local loss, no measured backward, no logged L / W."""
    runs = [SyntheticRun("sum", **LAYOUT, summary={"all_reduce_backward": None}), custom("hf", expect="grad L")]
    sweep = write_sweep(tmp_path / "sweep", runs)
    result = analyze([sweep], sweep / "analysis", wandb_mode="disabled", make_plots=False)
    points = rfc_points(result.answer)
    assert [point.split("? ", 1)[1].split(":")[0] for point in points] == ["Not measured here"] * 3


def test_without_identity_runs_the_report_says_nothing_of_identity(tmp_path):
    runs = [
        SyntheticRun("sum", **LAYOUT),
        SyntheticRun("local", factor=0.5, **LAYOUT),
        SyntheticRun("fsdp_sum", **LAYOUT),
    ]
    sweep = write_sweep(tmp_path / "sweep", runs)
    result = analyze([sweep], sweep / "analysis", wandb_mode="disabled", make_plots=False)
    assert "identity" not in result.answer and not (sweep / "analysis" / "trainers.csv").exists()
    _, all_reduce, _ = rfc_points(result.answer)
    assert "the backward gives each rank's loss ×2 (= W) in `sum`, whose gradient is grad L; without it the " in (
        all_reduce
    )
    assert "gradient is grad L / W (`local`)" in all_reduce
    assert "by FSDP SUM (`fsdp_sum`)." in all_reduce


def test_a_group_whose_only_sum_has_an_identity_backward_has_no_reference(tmp_path):
    runs = [
        SyntheticRun("sum", overrides={"autograd_all_reduce": "identity"}, factor=0.5, **LAYOUT),
        SyntheticRun("local", factor=0.5, **LAYOUT),
    ]
    sweep = write_sweep(tmp_path / "sweep", runs)
    result = analyze([sweep], sweep / "analysis", wandb_mode="disabled", make_plots=False)
    assert set(result.verdicts["verdict"]) == {"no reference"}


def test_the_trainers_plots_are_legible_with_a_colour_each(tmp_path, monkeypatch):
    """Long labels (custom:MODULE:CALLABLE) take a legend of fewer columns and more rows, inside the figure."""
    loaded = load_sweeps([write_sweep(tmp_path / "sweep", trainer_runs())])
    table = assign_groups(loaded.runs).reset_index(drop=True)
    _, curves = measure(table, loaded.steps, Tolerances())
    checked = {}

    def checking_save(fig, path, dpi=100):
        checked[path.name] = legibility_problems(fig)
        lines = [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() != "reference"]
        checked[path.name] += [] if len({line.get_color() for line in lines}) == len(lines) else ["a colour twice"]
        return save(fig, path, dpi)

    monkeypatch.setattr(curve_plots, "save", checking_save)
    curve_plots.curves_per_group(table, curves, tmp_path)
    assert set(checked) == {figure.file for figure in curve_plots.CURVE_FIGURES}
    assert {name: problems for name, problems in checked.items() if problems} == {}


def test_named_rules_appear_by_their_names_never_their_module_paths(tmp_path, monkeypatch):
    """In every table, plot legend and sentence: `custom.name` (with FSDP's reduction), never MODULE:CALLABLE;
    only a rule without a name is called by its callable."""
    sweep = write_sweep(tmp_path / "sweep", trainer_runs())
    legends = []

    def recording_save(fig, path, dpi=100):
        legends.extend(text.get_text() for legend in fig.legends for text in legend.get_texts())
        legends.extend(text.get_text() for ax in fig.axes if ax.get_legend() for text in ax.get_legend().get_texts())
        return save(fig, path, dpi)

    monkeypatch.setattr(curve_plots, "save", recording_save)
    monkeypatch.setattr("analysis.plots.background.Background.__init__", lambda self: setattr(self, "_pool", None))
    result = analyze([sweep], sweep / "analysis", wandb_mode="disabled")
    texts = {
        "report.md": (sweep / "analysis" / "report.md").read_text(),
        "trainers.csv": (sweep / "analysis" / "trainers.csv").read_text(),
        "verdicts.csv": (sweep / "analysis" / "verdicts.csv").read_text(),
        "comm.csv": (sweep / "analysis" / "comm.csv").read_text(),
        "legends": "\n".join(legends),
    }
    named = ["titan", "hf", "per_rank_mean", "doubled", "wrongly_stated"]
    assert {name: [f for f in named if f"my_trainers:{f}" in text] for name, text in texts.items()} == {
        name: [] for name in texts
    }
    assert label("titan", "sum") in texts["legends"] and label("titan") in texts["legends"]
    assert UNNAMED in texts["legends"] and UNNAMED in result.answer  # the one without a name
    assert {label("titan", "sum"), label("titan")} <= set(pd.read_csv(sweep / "analysis" / "trainers.csv")["trainer"])


def test_a_measured_backward_is_named_by_what_it_gives_at_its_world_size():
    from analysis.trainers.table import backward_kind

    for world in (1, 2, 3, 4, 8):
        named = {factor: backward_kind(factor, world) for factor in (float(world), 1.0, 0.5, 2.0 * world)}
        assert named[float(world)] == ("SUM = identity" if world == 1 else "SUM")
        assert named[1.0] == ("SUM = identity" if world == 1 else "identity")
        assert named[0.5] == "×0.5" and named[2.0 * world] == f"×{2 * world:g}"
    assert backward_kind(float("nan"), 2) == ""
