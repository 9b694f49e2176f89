"""Plots and tables that hold for any sweep: generated sweeps of 1..N steps, with and without a baseline, with
failed and never-run jobs and identical curves; every figure and table is checked for the properties that
short, failed or baseline-less runs used to break (fractional step ticks, an undrawn one-point curve, a
difference plot of raw losses, panels for what did not run, unlabelled reference levels, curves hidden
unnamed, `nan` cells)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from analysis.pipeline import analyze
from analysis.plots import curves as curve_plots
from analysis.plots.figures import REFERENCE, legibility_problems, save
from analysis.testing.synthetic import SyntheticRun, write_sweep


def sweep_runs(steps: int, baseline: bool, failed: bool, identical: bool, invalid_group: bool) -> list[SyntheticRun]:
    runs = [SyntheticRun("local", steps=steps, factor=0.5)]
    if baseline:
        runs.append(SyntheticRun("sum", steps=steps))
    if identical:  # fsdp_sum's curves are sum's exactly (scaled: local's, where there is no sum)
        runs.append(SyntheticRun("fsdp_sum" if baseline else "scaled", steps=steps, factor=1.0 if baseline else 0.5))
    if failed:
        runs.append(SyntheticRun("detached", steps=steps, status="failed", fail_after=0))  # died before a step
    if invalid_group:  # another group (seed 1) whose every job was refused: no panel
        runs += [SyntheticRun(mode, seed=1, steps=steps, status="invalid") for mode in ("sum", "local")]
    return runs


CASES = [
    dict(steps=steps, baseline=baseline, failed=failed, identical=identical, invalid_group=invalid)
    for steps, (baseline, failed, identical, invalid) in itertools.product(
        (1, 2, 3, 7, 25), itertools.product([True, False], repeat=4)
    )
    if not (steps in (2, 7) and failed and invalid)  # fewer cases; every property is met at every length
]


def _figures(tmp_path, monkeypatch, case: dict) -> tuple[dict, object]:
    sweep = write_sweep(tmp_path / "sweep", sweep_runs(**case))
    seen = {}

    def recording_save(fig, path, dpi=100):
        panels = [ax for ax in fig.axes if ax.get_visible()]
        seen[path.name] = {
            "problems": legibility_problems(fig),
            "panels": len(panels),
            "ticks": [
                t.get_text()
                for ax in panels
                for t, at in zip(ax.get_xticklabels(), ax.get_xticks())
                if t.get_text() and min(ax.get_xlim()) <= at <= max(ax.get_xlim())  # those drawn
            ],
            "curves": [line for ax in panels for line in ax.get_lines() if line.get_gid() != REFERENCE],
            "references": [t.get_text() for ax in panels for t in ax.texts],
            "legend": [t.get_text() for legend in fig.legends for t in legend.get_texts()],
        }
        return save(fig, path, dpi)

    monkeypatch.setattr(curve_plots, "save", recording_save)
    monkeypatch.setattr("analysis.plots.background.Background.__init__", lambda self: setattr(self, "_pool", None))
    result = analyze([sweep], sweep / "analysis", wandb_mode="disabled")
    return seen, result


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_every_figure_and_table_of_a_short_failed_or_baseline_less_sweep_is_readable(tmp_path, monkeypatch, case):
    seen, result = _figures(tmp_path, monkeypatch, case)
    steps, baseline = case["steps"], case["baseline"]
    assert "loss_curves.png" in seen
    # No baseline: nothing is compared, so no difference or gradient figure (raw losses are no difference).
    compared = {"loss_difference.png", "gradient_scale.png", "gradient_direction.png"}
    assert (compared <= set(seen)) if baseline else not (compared & set(seen))
    written = {p.name for p in result.report.parent.glob("*.png")}
    assert written - {"comm_overhead.png"} == set(seen)  # (the counted collectives: plots/cost.py's)
    named = {part.split(")")[0] for part in result.report.read_text().split("](")[1:]}
    assert named == written  # the report shows every figure drawn, and none that was not
    for name, figure in seen.items():
        assert figure["problems"] == [], name
        assert figure["panels"] == 1, name  # the group whose jobs were all refused has no panel
        ticks = [int(t.replace("−", "-")) for t in figure["ticks"]]  # whole steps only
        assert ticks and all(1 <= t <= steps for t in ticks), (name, figure["ticks"])
        for line in figure["curves"]:
            points = np.isfinite(np.asarray(line.get_ydata(), dtype=float)).sum()
            assert points >= 1, name  # a run without this curve (failed before a step) is not drawn
            assert (line.get_marker() not in (None, "None", "")) == (points <= curve_plots.FEW_POINTS), name
        labels = [label.replace("\n", " ") for label in figure["legend"]]
        assert not any("detached" in label for label in labels), name  # never ran a step: no legend entry
        identical = [label for label in labels if " = " in label]
        if case["identical"]:
            pair = "sum (baseline) = fsdp_sum" if baseline else "scaled = local"
            assert any(pair in label for label in identical), (name, labels)
        if name == "gradient_scale.png":
            assert set(figure["references"]) == {"1 (the baseline's)", "1/W = 1/2"}
        if name == "gradient_direction.png":
            assert figure["references"] == ["1 (same direction)"]
    report = result.report.read_text()
    assert "nan" not in report.replace("Nanstats", "").lower().split("![")[0], "a nan cell or sentence in report.md"


def test_a_one_step_run_is_drawn_as_a_point_on_the_step_1_tick(tmp_path, monkeypatch):
    seen, _ = _figures(
        tmp_path, monkeypatch, dict(steps=1, baseline=True, failed=False, identical=False, invalid_group=False)
    )
    loss = seen["loss_curves.png"]
    assert loss["ticks"] == ["1"]
    assert [line.get_marker() for line in loss["curves"]] == ["o"]  # one point, drawn as a marker
    assert loss["legend"] == ["sum (baseline) = local"]  # local's loss at step 1 is sum's: one curve, both named
