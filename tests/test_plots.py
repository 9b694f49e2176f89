"""The per-group figures: drawn on one reused grid of panels, yet each as if drawn alone."""

from __future__ import annotations

import numpy as np
from PIL import Image

from analysis import plots
from analysis.compare import Tolerances, measure
from analysis.groups import assign_groups
from analysis.load import load_sweeps
from analysis.synthetic import SyntheticRun, write_sweep


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

    paths = plots.curves_per_group(table, curves, together)
    assert (
        paths
        == plots.curve_figure_paths(curves, together)
        == [together / name for _, name, _, _ in plots.CURVE_FIGURES]
    )
    for figure in plots.CURVE_FIGURES:
        plots.draw_curve_figures(table, curves, [figure], alone)  # a fresh grid of panels for this figure only
        drawn, reference = (np.asarray(Image.open(folder / figure[1])) for folder in (together, alone))
        assert drawn.shape == reference.shape and drawn.shape[1] > 1000, figure[1]  # several panels
        assert (drawn == reference).all(), f"{figure[1]}: {(drawn != reference).any(-1).sum()} pixels differ"
    # The figures differ from one another (so the comparison above could fail): each replaced the last one's curves.
    loss, difference = (np.asarray(Image.open(together / name)) for name in ("loss_curves.png", "loss_difference.png"))
    assert (loss != difference).any(-1).sum() > 1000
