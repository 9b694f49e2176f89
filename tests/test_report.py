"""report.md states only what the runs show: no mode that did not run, no "n/a" for a step, a word where a
table would be empty, no section without its data."""

from __future__ import annotations

from analysis.pipeline import analyze
from analysis.testing.synthetic import SyntheticRun, write_sweep

OTHER_MODES = ("detached", "fsdp_sum", "scaled", "mean_of_means")


def test_a_short_sum_and_local_sweep_without_a_cost_job(tmp_path):
    runs = [SyntheticRun("sum", steps=4), SyntheticRun("local", steps=4, factor=0.5)]  # shorter than the warm-up
    sweep = write_sweep(tmp_path / "sweep", runs)
    result = analyze([sweep], sweep / "analysis", make_plots=False, wandb_mode="disabled")
    report = result.report.read_text()
    assert not any(f"`{mode}`" in report for mode in OTHER_MODES), report  # only the modes that ran
    assert "n/a" not in report
    assert "Step times: none, as every run is shorter than the 5 warm-up steps" in report
    assert "This analysis holds no interleaved cost job" in report and "Floor:" not in report
    assert "## Plots" not in report and "## Runs that did not complete" not in report
    assert "plots" not in " ".join(result.written)


def test_a_turned_gradient_whose_curves_stay_close_says_so(tmp_path):
    """A different direction with loss curves within tolerance: no 'departs from step n/a'."""
    runs = [SyntheticRun("sum", steps=20), SyntheticRun("mean_of_means", steps=20, turn=0.2)]
    sweep = write_sweep(tmp_path / "sweep", runs)
    report = analyze([sweep], sweep / "analysis", make_plots=False, wandb_mode="disabled").report.read_text()
    line = next(line for line in report.splitlines() if line.startswith("- `mean_of_means`"))
    assert "a different gradient" in line and "stays within tolerance of the baseline's" in line, line
    assert "n/a" not in report
