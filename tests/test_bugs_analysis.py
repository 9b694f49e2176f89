"""The "Known bugs" section, bugs.csv and `--check` on synthetic sweeps whose answers are known by construction
(analysis/testing/synthetic.py: each bug's reference, buggy and fixed arms, the buggy arm's gradient scaled or
turned as a bug would)."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.__main__ import main
from analysis.bugs.table import REPRODUCED_BY, SHOWN_AS
from analysis.pipeline import analyze
from analysis.testing.synthetic import SyntheticRun, known_bug_runs, write_sweep
from runner.config import Evidence


def analysed(tmp_path, runs):
    tmp_path.mkdir(parents=True, exist_ok=True)
    sweep = write_sweep(tmp_path / "sweep", runs)
    return sweep, analyze([sweep], tmp_path / "out", make_plots=False, wandb_mode="disabled")


def test_stated_factors_and_directions_are_reproduced_and_check_passes(tmp_path, capsys):
    runs = (
        known_bug_runs("halved", expect="1/2", buggy_factor=0.5)
        + known_bug_runs("ga_times_4", world_size=1, expect="4", buggy_factor=4.0)
        + known_bug_runs("turned", expect="different", buggy_turn=0.4, buggy_factor=1.3)
    )
    sweep, result = analysed(tmp_path, runs)
    bugs = result.bugs.set_index("bug")
    assert list(bugs["result"]) == ["reproduced"] * 3
    assert bugs.loc["halved", "buggy_vs_reference"] == "grad L × 1/2"
    assert bugs.loc["halved", "buggy_vs_fixed"].startswith("scale ×1/2, grad norm ×0.5")
    assert bugs.loc["ga_times_4", "buggy_vs_reference"] == "grad L × 4"
    assert bugs.loc["turned", "buggy_vs_reference"].startswith("another direction (step-1 cosine 0.9211")
    assert bugs.loc["turned", "fixed_vs_reference"].startswith("grad L (")
    assert bugs.loc["ga_times_4", "layout"] == "DP(1)-SP(1)-GA(1)"
    csv = pd.read_csv(tmp_path / "out" / "bugs.csv")
    assert list(csv["result"]) == ["reproduced"] * 3 and "reported signature" in csv
    report = (tmp_path / "out" / "report.md").read_text()
    section = report.split("## Known bugs\n\n", 1)[1]
    assert section.startswith(
        "Does each known bug reproduce here, and does its fix give the reference's gradient? Yes: all 3"
    )
    assert main([str(sweep), "--out", str(tmp_path / "check"), "--no-plots", "--wandb", "disabled", "--check"]) == 0
    assert (
        "all 3 known bugs show as stated, each fix equivalent to the reference: 3 reproduced" in capsys.readouterr().out
    )


CASES = {
    # name: (known_bug_runs arguments, the reason's words)
    "no_effect": (dict(expect="1/2", buggy_factor=1.0), "gives grad L at this layout: the bug does not show"),
    "other_factor": (dict(expect="1/2", buggy_factor=0.25), "gives grad L × 1/4, not the stated 1/2"),
    "fix_not_equivalent": (dict(expect="1/2", buggy_factor=0.5, fixed_factor=0.5), "the fix is not equivalent"),
    "buggy_failed": (dict(expect="different", buggy_status="failed"), "the buggy arm failed"),
    "stated_factor_but_turned": (dict(expect="2", buggy_factor=2.0, buggy_turn=0.5), "another direction"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bug_that_does_not_show_or_a_fix_that_is_not_the_reference_is_not_reproduced_and_check_fails(
    tmp_path, capsys, case
):
    kwargs, reason = CASES[case]
    runs = known_bug_runs("fine", expect="1/2", buggy_factor=0.5) + known_bug_runs(case, **kwargs)
    sweep, result = analysed(tmp_path, runs)
    bugs = result.bugs.set_index("bug")
    assert bugs.loc["fine", "result"] == "reproduced"
    assert bugs.loc[case, "result"] == "not reproduced"
    assert reason in bugs.loc[case, "why"]
    answer = (tmp_path / "out" / "report.md").read_text().split("## Known bugs\n\n", 1)[1].splitlines()[0]
    assert answer.startswith(
        f"Does each known bug reproduce here, and does its fix give the reference's gradient? No: 1 reproduced, 1 not reproduced; not reproduced: {case}: "
    )
    assert main([str(sweep), "--out", str(tmp_path / "check"), "--no-plots", "--wandb", "disabled", "--check"]) == 1
    out = capsys.readouterr().out
    assert "check FAILED: 1 of 2 known bug(s) not reproduced:" in out and f"  {case} (example/{case} #1): " in out


def test_a_sweep_without_known_bugs_has_no_such_section(tmp_path):
    from analysis.testing.synthetic import SyntheticRun

    _, result = analysed(tmp_path, [SyntheticRun("sum"), SyntheticRun("local", factor=0.5)])
    assert result.bugs.empty and "## Known bugs" not in (tmp_path / "out" / "report.md").read_text()
    assert not (tmp_path / "out" / "bugs.csv").exists()


def norm_bug(name: str, **kwargs) -> list:
    """A grad-norm bug's arms: the gradient grad L, the buggy arm's logged norm sqrt(2) x, its loss departing from
    step 2 (clipping binds) unless overridden."""
    given = dict(expect="different", grad_norm="sqrt(2)", buggy_norm_factor=2**0.5, buggy_departs_from=2)
    return known_bug_runs(name, **{**given, **kwargs})


def test_a_grad_norm_bug_is_judged_on_its_norm_with_the_gradient_the_reference(tmp_path, capsys):
    runs = norm_bug("norm") + norm_bug("unclipped", expect="grad L", buggy_departs_from=None)
    sweep, result = analysed(tmp_path, runs)
    bugs = result.bugs.set_index("bug")
    assert list(bugs["result"]) == ["reproduced"] * 2
    assert bugs.loc["norm", "buggy_vs_reference"].startswith(
        "step-1 gradient ×1 (cosine 1.000000), grad norm ×1.41421 (stated sqrt(2)); update departs: same step-1"
    )
    assert bugs.loc["norm", "why"].endswith("grad norm ×1.41421, as stated; the clipped update departs")
    assert bugs.loc["unclipped", "buggy_vs_reference"].endswith("(stated sqrt(2)); loss curves match")
    assert bugs.loc["norm", "buggy_vs_fixed"] == "scale ×1, grad norm ×1.414"
    csv = pd.read_csv(tmp_path / "out" / "bugs.csv").set_index("bug")
    assert csv.loc["norm", "expected"] == "different; grad norm ×sqrt(2)"
    assert main([str(sweep), "--out", str(tmp_path / "check"), "--no-plots", "--wandb", "disabled", "--check"]) == 0
    assert (
        "all 2 known bugs show as stated, each fix equivalent to the reference: 2 reproduced" in capsys.readouterr().out
    )


NORM_CASES = {
    # name: (norm_bug arguments, the reason's words)
    "norm_right": (dict(buggy_norm_factor=1.0), "grad norm is ×1 the reference's: the bug does not show"),
    "norm_other": (dict(buggy_norm_factor=2.0), "grad norm is ×2 the reference's: not the stated sqrt(2)"),
    "gradient_scaled": (dict(buggy_factor=0.5, buggy_norm_factor=2.0), "step-1 gradient is not the reference's"),
    "gradient_turned": (dict(buggy_turn=0.3), "step-1 gradient is not the reference's"),
    "clip_not_binding": (dict(buggy_departs_from=None), "update is not as stated (different)"),
}


@pytest.mark.parametrize("case", list(NORM_CASES))
def test_a_grad_norm_bug_with_the_wrong_norm_or_a_changed_gradient_is_not_reproduced(tmp_path, capsys, case):
    kwargs, reason = NORM_CASES[case]
    sweep, result = analysed(tmp_path, norm_bug("fine") + norm_bug(case, **kwargs))
    bugs = result.bugs.set_index("bug")
    assert bugs.loc["fine", "result"] == "reproduced"
    assert bugs.loc[case, "result"] == "not reproduced"
    assert reason in bugs.loc[case, "why"], bugs.loc[case, "why"]
    assert main([str(sweep), "--out", str(tmp_path / "check"), "--no-plots", "--wandb", "disabled", "--check"]) == 1
    assert "check FAILED: 1 of 2 known bug(s) not reproduced:" in capsys.readouterr().out


@pytest.mark.parametrize("evidence", [kind.value for kind in Evidence])
def test_a_bug_shown_as_stated_is_reproduced_only_with_a_release_an_upstream_test_or_the_reports_example(
    tmp_path, capsys, evidence
):
    """Every kind of evidence, with the arms as stated and not: the evidence names a bug that shows; it never
    turns one that does not show into a pass."""
    runs = known_bug_runs("shows", expect="1/2", buggy_factor=0.5, evidence=evidence)
    runs += known_bug_runs("does_not_show", expect="1/2", buggy_factor=1.0, evidence=evidence)
    sweep, result = analysed(tmp_path, runs)
    bugs = result.bugs.set_index("bug")
    shown = "reproduced" if evidence in REPRODUCED_BY else SHOWN_AS[evidence]
    assert bugs.loc["shows", "result"] == shown and bugs.loc["does_not_show", "result"] == "not reproduced"
    assert bugs.loc["shows", "evidence"] == f"{evidence}: shows's evidence"
    assert bugs.loc["shows", "why"].startswith("the buggy arm gives grad L × 1/2, as stated; the fix gives grad L")
    assert (evidence in REPRODUCED_BY) == bugs.loc["shows", "why"].endswith("the fix gives grad L")
    csv = pd.read_csv(tmp_path / "out" / "bugs.csv").set_index("bug")
    assert csv.loc["shows", "evidence"] == f"{evidence}: shows's evidence"
    main([str(sweep), "--out", str(tmp_path / "check"), "--no-plots", "--wandb", "disabled", "--check"])
    assert "check FAILED: 1 of 2 known bug(s) not reproduced:" in capsys.readouterr().out
    answer = (tmp_path / "out" / "report.md").read_text().split("## Known bugs\n\n", 1)[1].splitlines()[0]
    assert answer.endswith(
        f"No: 1 {shown}, 1 not reproduced; not reproduced: does_not_show: the buggy arm gives grad L at this layout: the bug does not show."
    )


def test_a_bug_shown_on_weaker_evidence_passes_check_under_its_own_name(tmp_path, capsys):
    runs = known_bug_runs("released", expect="1/2", buggy_factor=0.5)
    runs += known_bug_runs("read", expect="2", buggy_factor=2.0, evidence="paraphrase")
    runs += known_bug_runs("built", expect="different", buggy_turn=0.4, evidence="constructed")
    sweep, result = analysed(tmp_path, runs)
    assert list(result.bugs["result"]) == ["reproduced", "shown (paraphrase)", "constructed"]
    assert main([str(sweep), "--out", str(tmp_path / "check"), "--no-plots", "--wandb", "disabled", "--check"]) == 0
    assert (
        "check: all 3 known bugs show as stated, each fix equivalent to the reference: "
        "1 reproduced, 1 shown (paraphrase), 1 constructed"
    ) in capsys.readouterr().out
    answer = (tmp_path / "out" / "report.md").read_text().split("## Known bugs\n\n", 1)[1].splitlines()[0]
    assert answer.endswith(
        "Yes: all 3 bugs showed as stated, each fix grad L (1 reproduced, 1 shown (paraphrase), 1 constructed)."
    )


def test_a_bug_arm_never_answers_the_rfc_nor_reads_as_nothing_compared(tmp_path):
    # The buggy arm divides by 2 at W=2 without an all-reduce in the graph: the local loss's signature, but not
    # the local loss (Ulysses SP's 1/sp at W = sp). Beside it, the runner's own `local` answers the RFC.
    bug_only, _ = analysed(tmp_path / "alone", known_bug_runs("halved", expect="1/2", buggy_factor=0.5))
    report = (tmp_path / "alone" / "out" / "report.md").read_text()
    answer = report.split("## Answer\n\n", 1)[1]
    assert answer.startswith("Of the runner's own modes only the reference ran here; 2 runs of other rules (")
    assert "No run here could be compared" not in report and "**The RFC**" not in report

    runs = known_bug_runs("halved", expect="1/2", buggy_factor=0.5) + [
        SyntheticRun("sum"),
        SyntheticRun("local", factor=0.5),
    ]
    analysed(tmp_path / "beside", runs)
    report = (tmp_path / "beside" / "out" / "report.md").read_text()
    point_1 = report.split("1. Can FSDP train with the local loss alone? ", 1)[1].split("\n", 1)[0]
    assert point_1.startswith("Yes, but its gradient is grad L / W, not grad L: `local` (no all-reduce"), point_1
    assert "halved" not in report.split("**The RFC**", 1)[1].split("\n\n", 2)[1]
