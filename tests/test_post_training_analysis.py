"""The post-training analysis (rl.csv, the report's "Post-training aggregation", `--check`) on synthetic sweeps
whose answers are known by construction: each mode's gradient at each layout is its W=1 gradient times a factor
or turned by an angle (analysis.testing.synthetic: turns add, so two runs' step-1 cosine is cos(a - b))."""

from __future__ import annotations

import itertools
import math

import pandas as pd
import pytest

from analysis.__main__ import main as analysis_main
from analysis.pipeline import analyze
from analysis.testing.synthetic import PG_LAYOUTS, SyntheticRun, pg_run, write_sweep
from runner.modes import UNITS, heavier_tokens, layout_expectation

QUESTION = (
    "Is every post-training mode's gradient invariant to the layout (against the same mode at W=1, grad_accum=1)?"
)
PAPERS = {
    "GRPO (paper)": ("response", 0.5, 0.9),
    "DAPO (paper)": ("prompt", -0.3, 1.2),
    "Dr. GRPO (paper)": ("token", 0.0, 0.5),
}
# Each paper's (what it weighs alike, its turn, its factor) at every layout: the papers' objectives are invariant.


def _sizes(layout: str) -> tuple[int, int, int]:
    """(dp, sp, grad_accum) of a layout."""
    world, sp, grad_accum = PG_LAYOUTS[layout]
    return world // sp, sp, grad_accum


def papers_and_reference() -> list[SyntheticRun]:
    runs = [
        SyntheticRun("sum", *PG_LAYOUTS[layout], steps=3, overrides={"objective.name": "pg"}) for layout in PG_LAYOUTS
    ]
    for name, (unit, turn, factor) in PAPERS.items():
        runs += [pg_run(name, layout, unit, "invariant", turn=turn, factor=factor, paper=name) for layout in PG_LAYOUTS]
    return runs


# Modes whose behaviour is known: (name, weighs, stated, {layout: (factor, turn)} away from (1, 0)).
MODES = [
    ("token mean", "token", "invariant", {}),
    ("bnpo-like", "token", "changes with dp, grad_accum", {"w1_ga2": (1, 0.1), "w2": (1, 0.2)}),
    ("cp-count-like", "token", "changes with sp", {"w2_sp2": (1, 0.15)}),
    ("sum over dp", "token", "x dp", {"w2": (2, 0)}),
    ("response mean", "response", "invariant", {}),
]


def mode_runs() -> list[SyntheticRun]:
    runs = []
    for name, unit, stated, changed in MODES:
        base_turn = 0.5 if unit == "response" else 0.0  # a per-response mean turns as GRPO's objective does
        for layout in PG_LAYOUTS:
            factor, turn = changed.get(layout, (1, 0))
            runs.append(pg_run(name, layout, unit, stated, factor=factor, turn=base_turn + turn))
    return runs


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    sweep = write_sweep(tmp_path_factory.mktemp("pg") / "sweep", papers_and_reference() + mode_runs())
    return sweep, analyze([sweep], sweep / "analysis", make_plots=False, wandb_mode="disabled")


def test_each_mode_against_itself_at_w1_says_what_changed_and_with_which_axis(known):
    _, result = known
    rl = result.post_training.set_index("mode")
    assert rl.loc["token mean", "invariant"] and rl.loc["response mean", "invariant"]
    assert rl.loc["sum", "invariant"] and all(rl.loc[name, "invariant"] for name in PAPERS)
    assert not rl.loc["bnpo-like", "invariant"] and rl.loc["bnpo-like", "changes_with"] == "dp, grad_accum"
    assert rl.loc["bnpo-like", "changes"] == (
        f"another direction (cos {math.cos(0.1):.4f}) with grad_accum; another direction (cos {math.cos(0.2):.4f}) with dp"
    )
    assert rl.loc["cp-count-like", "changes_with"] == "sp"
    assert rl.loc["cp-count-like", "changes"] == f"another direction (cos {math.cos(0.15):.4f}) with sp"
    assert rl.loc["sum over dp", "changes"] == "×2 with dp" and rl.loc["sum over dp", "changes_with"] == "dp"
    assert rl["as_expected"].all(), rl[["as_expected"]]
    runs = result.post_training_runs.set_index(["name", "layout"])
    assert runs.loc[("bnpo-like", "DP(2)-SP(1)-GA(1)"), "cos"] == pytest.approx(math.cos(0.2), abs=1e-9)
    assert runs.loc[("sum over dp", "DP(2)-SP(1)-GA(1)"), "scale"] == pytest.approx(2, rel=1e-9)
    assert (result.out / "rl.csv").exists() and (result.out / "rl_runs.csv").exists()


def test_each_mode_against_each_paper_says_which_tokens_it_weighs_more(known):
    _, result = known
    papers = result.post_training_papers.set_index(["name", "paper_name"])
    token_vs_grpo = papers.loc[("token mean", "GRPO (paper)")]
    assert token_vs_grpo["heavier"] == "long responses' tokens" and token_vs_grpo["cos"] == pytest.approx(math.cos(0.5))
    assert token_vs_grpo["difference"] == f"long responses' tokens more (cos {math.cos(0.5):.4f})"
    assert papers.loc[("token mean", "DAPO (paper)"), "heavier"] == "the tokens of long groups"
    assert papers.loc[("token mean", "Dr. GRPO (paper)"), "difference"] == "weighs tokens alike (×2)"
    assert papers.loc[("response mean", "GRPO (paper)"), "difference"] == "weighs tokens alike (×1.11111)"
    assert papers.loc[("response mean", "Dr. GRPO (paper)"), "heavier"] == "short responses' tokens"
    assert papers["as_declared"].all()
    rl = result.post_training.set_index("mode")
    assert rl.loc["token mean", "vs GRPO (paper)"] == token_vs_grpo["difference"]
    assert (
        rl.loc["GRPO (paper)", "vs DAPO (paper)"]
        == f"the tokens of responses short for their group more (cos {math.cos(0.8):.4f})"
    )


def test_the_section_opens_with_its_answer_then_the_table(known):
    _, result = known
    lines = result.report.read_text().split("## Post-training aggregation\n\n", 1)[1].splitlines()
    assert lines[0] == (
        f"{QUESTION} No, 6 of 9 are (`sum`, `GRPO (paper)`, `DAPO (paper)`, `Dr. GRPO (paper)`, `token mean`, "
        "`response mean`); `bnpo-like` changes direction with dp and grad_accum, `cp-count-like` changes "
        "direction with sp and `sum over dp` changes by a factor with dp."
    )
    assert lines[2].startswith("| mode ") and "| vs GRPO (paper) " in lines[2]
    assert any(line.startswith("| bnpo-like ") and "| no " in line for line in lines[4:14])
    assert "All 9 modes judged give what they state" in result.report.read_text()
    assert QUESTION in result.answer and {"rl.csv", "rl_runs.csv", "rl_papers.csv"} <= set(result.written)


def test_check_passes_as_stated_and_fails_where_a_mode_is_not(known, tmp_path, capsys):
    sweep, _ = known
    assert (
        analysis_main([str(sweep), "--out", str(tmp_path / "ok"), "--no-plots", "--wandb", "disabled", "--check"]) == 0
    )
    assert "post-training comparisons are as stated" in capsys.readouterr().out
    wrong_layout = [
        pg_run("claims invariant", layout, "token", "invariant", turn=0.2 * (layout == "w2")) for layout in PG_LAYOUTS
    ]
    wrong_unit = [pg_run("claims token", layout, "token", "invariant", turn=0.5) for layout in PG_LAYOUTS]  # GRPO's
    for name, extra in (("layout", wrong_layout), ("unit", wrong_unit)):
        bad = write_sweep(tmp_path / name, papers_and_reference() + extra)
        assert analysis_main([str(bad), "--no-plots", "--wandb", "disabled", "--check"]) == 1, name
        out = capsys.readouterr().out
        assert "check FAILED" in out and ("claims invariant" in out if name == "layout" else "claims token" in out)


STATEMENTS = ["invariant", "x dp", "x sp", "x grad_accum", "changes with dp", "changes with sp", "changes with grad_accum",
              "changes with dp, grad_accum"]  # fmt: skip
BEHAVIOURS = [("none", None), *[(kind, axis) for kind in ("scale", "turn") for axis in ("dp", "sp", "grad_accum")]]


def _behaves(kind: str, axis: str | None, layout: str) -> tuple[float, float]:
    """(factor, turn) of a mode that scales by the axis' size, or turns by 0.1 rad per axis above 1, at a layout."""
    size = dict(zip(("dp", "sp", "grad_accum"), _sizes(layout))).get(axis, 1)
    return (float(size), 0.0) if kind == "scale" else (1.0, 0.1 * (size > 1)) if kind == "turn" else (1.0, 0.0)


def test_every_statement_against_every_behaviour_is_judged_as_the_formula_says(tmp_path):
    """Generated: each layout statement (custom.expect_layouts) x each true behaviour (invariant, a factor or a
    turn with one axis), at the four layouts. As stated exactly where the statement's factor or direction at each
    layout is the behaviour's."""
    runs, truth = papers_and_reference(), {}
    for (i, stated), (j, (kind, axis)) in itertools.product(enumerate(STATEMENTS), enumerate(BEHAVIOURS)):
        name = f"s{i}b{j}"
        for layout in PG_LAYOUTS:
            factor, turn = _behaves(kind, axis, layout)
            runs.append(pg_run(name, layout, "token", stated, factor=factor, turn=turn))
        said = [layout_expectation(stated, *_sizes(layout)) for layout in PG_LAYOUTS]
        did = [_behaves(kind, axis, layout) for layout in PG_LAYOUTS]
        truth[name] = all(
            (s == "different") == (t != 0) and (s == "different" or s == f) for s, (f, t) in zip(said, did)
        )
    result = analyze([write_sweep(tmp_path / "sweep", runs)], tmp_path / "out", make_plots=False, wandb_mode="disabled")
    judged = result.post_training.set_index("mode")["as_expected"]
    assert {name: bool(judged[name]) for name in truth} == truth
    assert 0 < sum(truth.values()) < len(truth)  # both answers occur


def test_every_pair_of_units_is_judged_by_its_direction(tmp_path):
    """Generated: a mode weighing each unit alike (its direction: the paper's of that unit) against each paper,
    declared rightly or wrongly: as declared exactly where the declaration is its true unit."""
    turn_of = {unit: turn for unit, turn, _ in PAPERS.values()}
    runs = papers_and_reference()
    for true_unit, said_unit in itertools.product(UNITS, UNITS):
        runs.append(pg_run(f"{true_unit} as {said_unit}", "w1", said_unit, "invariant", turn=turn_of[true_unit]))
    result = analyze([write_sweep(tmp_path / "sweep", runs)], tmp_path / "out", make_plots=False, wandb_mode="disabled")
    papers = result.post_training_papers
    for _, row in papers[papers["name"].str.contains(" as ")].iterrows():
        true_unit, said_unit = row["name"].split(" as ")
        assert row["parallel"] == (true_unit == row["paper_weighs"]), row["name"]
        assert row["as_declared"] == ((true_unit == row["paper_weighs"]) == (said_unit == row["paper_weighs"]))
        heavier = heavier_tokens(said_unit, row["paper_weighs"])
        assert row["heavier"] == heavier if heavier else pd.isna(row["heavier"])


def test_an_invariance_verdict_says_which_axes_it_was_tested_on(tmp_path):
    # A trimmed sweep that varies sp alone: bnpo-like (stated to change with dp and grad_accum) stays the same at
    # w2_sp2, which says nothing of dp or grad_accum.
    layouts = ["w1", "w2_sp2"]
    runs = [SyntheticRun("sum", *PG_LAYOUTS[layout], steps=3, overrides={"objective.name": "pg"}) for layout in layouts]
    runs += [pg_run("bnpo-like", layout, "token", "changes with dp, grad_accum") for layout in layouts]
    result = analyze([write_sweep(tmp_path / "sweep", runs)], tmp_path / "out", make_plots=False, wandb_mode="disabled")
    row = result.post_training.set_index("mode").loc["bnpo-like"]
    assert bool(row["invariant"]) and row["axes_tested"] == "sp"
    report = (tmp_path / "out" / "report.md").read_text()
    assert (
        f"{QUESTION} Yes, all 2 are (over the axes this analysis varied: sp; dp and grad_accum not varied, so not "
        "tested)." in report
    )
    assert "| yes, over sp |" in report
