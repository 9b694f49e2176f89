"""The plots: the per-group figures drawn on one reused grid of panels yet each as if drawn alone, and every\nplot legible."""

from __future__ import annotations

import numpy as np
from matplotlib.colors import to_rgba
from PIL import Image

from analysis.cost.comm import comm_table
from analysis.cost.interleaved import cost_table
from analysis.gradients.groups import assign_groups
from analysis.gradients.measures import measure
from analysis.gradients.tolerances import Tolerances
from analysis.load.sweeps import load_sweeps
from analysis.plots import cost as plots_cost
from analysis.plots import curves as curve_plots
from analysis.plots.figures import legibility_problems, save
from analysis.testing.synthetic import SyntheticRun, write_cost_job, write_sweep
from runner.modes import COLOURS


def test_each_figure_is_pixel_identical_to_one_drawn_on_its_own_panels(tmp_path):
    runs = [SyntheticRun("sum", world_size=1, steps=30)]
    for world in (2, 4):
        runs += [
            SyntheticRun("sum", world_size=world, steps=30),
            SyntheticRun("local", world_size=world, steps=30, factor=1 / world),
            SyntheticRun("mean_of_means", world_size=world, steps=20, turn=0.3, loss_shift_from=5),
        ]
    runs.append(
        SyntheticRun("sum", world_size=2, seed=1, steps=30, overrides={"optim.name": "sgd"})
    )  # another group, other scales
    loaded = load_sweeps([write_sweep(tmp_path / "sweep", runs)])
    table = assign_groups(loaded.runs).reset_index(drop=True)
    _, curves = measure(table, loaded.steps, Tolerances())
    together, alone = tmp_path / "together", tmp_path / "alone"
    together.mkdir(), alone.mkdir()

    paths = curve_plots.curves_per_group(table, curves, together)
    assert (
        paths
        == curve_plots.curve_figure_paths(curves, together)
        == [together / figure.file for figure in curve_plots.CURVE_FIGURES]
    )
    for figure in curve_plots.CURVE_FIGURES:
        curve_plots.draw_curve_figures(table, curves, [figure], alone)  # a fresh grid of panels for this figure only
        drawn, reference = (np.asarray(Image.open(folder / figure.file)) for folder in (together, alone))
        assert drawn.shape == reference.shape and drawn.shape[1] > 1000, figure.file  # several panels
        assert (drawn == reference).all(), f"{figure.file}: {(drawn != reference).any(-1).sum()} pixels differ"
    # The figures differ from one another (so the comparison above could fail): each replaced the last one's curves.
    loss, difference = (np.asarray(Image.open(together / name)) for name in ("loss_curves.png", "loss_difference.png"))
    assert (loss != difference).any(-1).sum() > 1000


def test_every_plot_is_legible_float_noise_included(tmp_path, monkeypatch):
    """No axis shows an offset (float noise of 1e-9 drawn as swings), every label lies inside its figure,
    step axes have whole steps, and `local` is not compared with itself."""
    runs = [
        SyntheticRun("sum", steps=12),
        SyntheticRun("fsdp_sum", steps=12, factor=1 + 1e-9, loss_shift_from=1, loss_shift=1e-9),  # float noise
        SyntheticRun("local", steps=12, factor=0.5, loss_shift_from=6, loss_shift=0.003),
        SyntheticRun("sum", steps=12, seed=1, overrides={"optim.name": "sgd"}),
        SyntheticRun("mean_of_means", steps=12, seed=1, turn=0.2, loss_shift_from=3, overrides={"optim.name": "sgd"}),
    ]
    sweep = write_sweep(tmp_path / "sweep", runs)
    write_cost_job(sweep / "cost", {"sum": 1.05, "fsdp_sum": 1.0, "scaled": 1.0}, steps=40)
    loaded = load_sweeps([sweep])
    table = assign_groups(loaded.runs).reset_index(drop=True)
    _, curves = measure(table, loaded.steps, Tolerances())
    checked = {}

    def checking_save(fig, path, dpi=100):
        checked[path.name] = legibility_problems(fig)
        if path.name in {figure.file for figure in curve_plots.CURVE_FIGURES}:
            for ax in fig.axes:
                labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
                checked[path.name] += [f"step tick {label}" for label in labels if not label.lstrip("−-").isdigit()]
        if path.name == "comm_overhead.png":  # counted calls only: one panel, whole numbers, local's bar among them
            checked[path.name] += [f"a second panel {ax.get_ylabel()!r}" for ax in fig.axes[1:]]
            bars = fig.axes[0].patches
            heights = [bar.get_height() for bar in bars if np.isfinite(bar.get_height())]  # NaN: not run in that group
            checked[path.name] += [f"a bar of {height} calls" for height in heights if not height.is_integer()]
            if not any(bar.get_facecolor() == to_rgba(COLOURS["local"]) for bar in bars):
                checked[path.name].append("no bar for local")
        return save(fig, path, dpi)

    monkeypatch.setattr(curve_plots, "save", checking_save)
    monkeypatch.setattr(plots_cost, "save", checking_save)
    out = tmp_path / "out"
    out.mkdir()
    curve_plots.curves_per_group(table, curves, out)
    plots_cost.comm_overhead(comm_table(table, loaded.steps), out)
    plots_cost.interleaved_cost(cost_table(loaded.cost_jobs), out)
    assert set(checked) == {figure.file for figure in curve_plots.CURVE_FIGURES} | {
        "comm_overhead.png",
        "interleaved_cost.png",
    }
    assert {name: problems for name, problems in checked.items() if problems} == {}


def test_the_legibility_check_finds_an_offset_and_a_cut_label():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([1, 2, 3], [1 + 1e-9, 1 + 2e-9, 1 + 3e-9])  # matplotlib's default formatter shows an offset here
    ax.set_ylabel("a y label far too long to fit in a figure this narrow, surely")
    fig.subplots_adjust(left=0.02)
    problems = legibility_problems(fig)
    plt.close(fig)
    assert any("offset" in p for p in problems) and any("cut off" in p for p in problems), problems
