"""The per-group PNG plots of an analysis (matplotlib, no display needed); the cost plots are in `cost.py`.

- loss_curves.png: the loss of every mode per comparison group, the baseline dashed
- loss_difference.png: each run's loss minus its baseline's, per step
- gradient_scale.png / gradient_direction.png: sketch scale k and cosine
  against the baseline per step (k = 1/W is a flat line for local/detached)

One panel per comparison group, at most MAX_GROUPS of them (the report says
when groups were left out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.plots.figures import plotted_groups, save, style_axes, widen_to  # noqa: E402
from runner.modes import COLOURS, colours_for  # noqa: E402

COLORS = COLOURS  # one colour per mode, from the modes' facts


# Panel and margin sizes in inches; the figure grows with the panel grid. LEFT and GAP hold a panel's
# y label and tick labels (6 significant digits at most), BOTTOM the last row's x label and the legend.
PANEL_W, PANEL_H = 4.2, 3.0
LEFT, RIGHT, TOP, BOTTOM, GAP = 1.05, 0.2, 0.7, 0.9, 0.95


def _width(count: int) -> float:
    cols = min(count, 4)
    return LEFT + RIGHT + PANEL_W * cols + GAP * (cols - 1)


def _legend_grid(labels: list[str], width: float) -> tuple[int, int]:
    """(columns, rows) of a legend of `labels` that fits `width` inches (9 pt text: about 0.07 in a character,
    0.6 in for the line and the spacing): long labels (custom:MODULE:CALLABLE) take fewer columns, more rows."""
    longest = max((len(label) for label in labels), default=1)
    fits = max(1, int(width // (0.07 * longest + 0.6)))
    columns = max(1, min(len(labels), fits))
    return columns, math.ceil(len(labels) / columns)


def _panels(count: int, legend_rows: int = 2):
    """A grid of `count` panels, 4 wide at most, with fixed margins (tight_layout would draw it all twice);
    the bottom margin holds two legend rows, and grows for more."""
    cols = min(count, 4)
    rows = math.ceil(count / cols)
    width = _width(count)
    bottom = BOTTOM + 0.2 * max(0, legend_rows - 2)
    height = TOP + bottom + PANEL_H * rows + 0.6 * (rows - 1)
    fig, axes = plt.subplots(rows, cols, figsize=(width, height), squeeze=False, sharex=True)
    fig.subplots_adjust(
        left=LEFT / width,
        right=1 - RIGHT / width,
        bottom=bottom / height,
        top=1 - TOP / height,
        wspace=GAP / PANEL_W,
        hspace=0.6 / PANEL_H,
    )
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat)[:count]


@dataclass(frozen=True)
class CurveFigure:
    curve: str  # a curve of `analysis.gradients.measures.measure`
    file: str
    title: str
    ylabel: str
    min_span: float  # the y range's least height: differences below it are drawn flat
    caption: str  # under the figure in report.md


CURVE_FIGURES = [
    CurveFigure("loss", "loss_curves.png", "Loss per comparison group", "loss", 0.0, "The baseline is dashed."),
    CurveFigure(
        "loss_diff", "loss_difference.png", "Loss minus the baseline's loss", "Δ loss", 1e-2,
        "Differences under 0.01 are drawn flat (the curves match while |Δloss| <= 0.001 × the baseline's loss).",
    ),
    # Step 1 is the clean factor (same parameters); later steps compare gradients
    # at parameters that have drifted apart unless the runs are equivalent.
    CurveFigure(
        "sketch_scale", "gradient_scale.png", "Gradient scale k against the baseline (sketch)", "k", 2e-3,
        "Step 1 gives the clean factor (the same parameters); later, runs that train differently have drifted apart.",
    ),
    CurveFigure(
        "sketch_cos", "gradient_direction.png", "Gradient direction: cosine with the baseline", "cosine", 2e-3,
        "After step 1, runs that train differently have drifted apart, so their cosine falls for that reason too.",
    ),
]  # fmt: skip


def curve_figure_jobs(runs: pd.DataFrame, curves: dict[str, np.ndarray], out: Path) -> list[tuple]:
    """The CURVE_FIGURES whose curve is in `curves` (no sketch: no gradient figures), one panel per group, as
    jobs (`draw_curve_figures`, its arguments): one job, all figures on one grid of panels (making a grid
    of 16 panels costs about a fifth of the drawing, and the forked process runs its jobs one after
    another anyway). The arguments are the plotted runs as plain Python objects and their curves as
    arrays, so that a forked process (`background.py`) can draw them without running Arrow code."""
    figures = [figure for figure in CURVE_FIGURES if figure.curve in curves]
    plotted = runs["group"].isin(plotted_groups(runs)).to_numpy()
    members = (
        runs.loc[plotted, ["group", "group_label", "run", "baseline", "reduction"]]
        .astype(object)
        .reset_index(drop=True)
    )
    return (
        [(draw_curve_figures, (members, {f.curve: curves[f.curve][plotted] for f in figures}, figures, out))]
        if figures
        else []
    )


def curve_figure_paths(curves: dict[str, np.ndarray], out: Path) -> list[Path]:
    """The files `curve_figure_jobs` draws, in its order."""
    return [out / figure.file for figure in CURVE_FIGURES if figure.curve in curves]


def curves_per_group(runs: pd.DataFrame, curves: dict[str, np.ndarray], out: Path) -> list[Path]:
    """The per-group figures (see `curve_figure_jobs`), drawn in this process."""
    return [path for draw, args in curve_figure_jobs(runs, curves, out) for path in draw(*args)]


def draw_curve_figures(
    runs: pd.DataFrame, curves: dict[str, np.ndarray], figures: list[CurveFigure], out: Path
) -> list[Path]:
    """`figures` (CURVE_FIGURES entries) drawn on one grid of panels, one figure after another.

    Making the axes and their ticks is most of a figure's cost, so it is paid once,
    and each figure only replaces the previous one's curves, legend, title and y
    labels before it is saved.
    """
    groups = plotted_groups(runs)
    shown = runs[runs["group"].isin(groups)]
    labels = list(dict.fromkeys(_label(run) for _, run in shown.iterrows()))
    legend = _legend_grid(labels, _width(len(groups)))
    colours = colours_for(shown["reduction"])
    fig, axes = _panels(len(groups), legend_rows=legend[1])
    for ax, group in zip(axes, groups):
        _style_panel(ax, runs.loc[runs["group"] == group, "group_label"].iloc[0])
    paths = []
    for figure in figures:
        _draw_curves(fig, axes, runs, groups, curves[figure.curve], figure, legend[0], colours)
        paths.append(save(fig, out / figure.file))
    plt.close(fig)
    return paths


def _style_panel(ax, label: str) -> None:
    ax.set_title(label, fontsize=9, y=1.0)  # a fixed y skips matplotlib's costly automatic title placement
    ax.set_xlabel("step")
    style_axes(ax, integer_x=True)


def _label(run) -> str:
    return f"{run['reduction']} (baseline)" if run["run"] == run["baseline"] else str(run["reduction"])


def _draw_curves(
    fig, axes, runs: pd.DataFrame, groups: list[str], values: np.ndarray, figure: CurveFigure, columns: int, colours
) -> None:
    """values[run, step] as one line per run in its group's panel (baseline dashed), in place of the last figure's."""
    for legend in fig.legends[:]:
        legend.remove()
    steps = np.arange(1, values.shape[1] + 1)
    for ax, group in zip(axes, groups):
        for line in ax.get_lines()[:]:
            line.remove()
        members = runs[runs["group"] == group]
        for row, run in members.iterrows():
            position = runs.index.get_loc(row)
            baseline = run["run"] == run["baseline"]
            ax.plot(
                steps,
                values[position],
                "--" if baseline else "-",
                color=colours.get(run["reduction"], "grey"),
                lw=1.2,
                label=_label(run),
            )
        ax.relim()
        ax.autoscale()
        widen_to(ax, figure.min_span)
        ax.set_ylabel(figure.ylabel)
    fig.suptitle(figure.title, y=1 - 0.15 / fig.get_figheight(), va="top")  # a second call replaces the first
    handles = {h.get_label(): h for ax in axes for h in ax.get_lines()}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=columns, frameon=False, fontsize=9)
