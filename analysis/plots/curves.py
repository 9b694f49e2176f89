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

from analysis.gradients.groups import data_ranks  # noqa: E402
from analysis.plots.figures import (  # noqa: E402
    REFERENCE,
    plotted_groups,
    reference_line,
    save,
    step_axis,
    style_axes,
    widen_to,
)
from runner.modes import COLOURS, colours_for, label_order  # noqa: E402

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
    lines = [label.split("\n") for label in labels]  # an entry of identical curves may take several lines
    longest = max((len(line) for entry in lines for line in entry), default=1)
    fits = max(1, int(width // (0.07 * longest + 0.6)))
    columns = max(1, min(len(labels), fits))
    per_column = math.ceil(len(labels) / columns)  # matplotlib fills a legend's columns one after another
    heights = [sum(len(entry) for entry in lines[i : i + per_column]) for i in range(0, len(lines), per_column)]
    return columns, max(heights, default=1)


def _joined(labels: list[str], width: int) -> str:
    """Labels of identical curves as one legend entry, "a = b = c", in lines of about `width` characters."""
    lines = [labels[0]]
    for label in labels[1:]:
        if len(lines[-1]) + 3 + len(label) <= width:
            lines[-1] += f" = {label}"
        else:
            lines.append(f"= {label}")
    return "\n".join(lines)


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


FEW_POINTS = 20  # a curve of at most this many points is drawn with a marker at each


def identical_curves(values: np.ndarray, positions: list[int]) -> list[list[int]]:
    """`positions` (rows of `values`) in clusters of identical curves (NaN equal to NaN), in their order: a
    cluster is drawn once, its labels joined ("sum = fsdp_sum"), so that no curve hides another unnamed."""
    clusters: list[list[int]] = []
    for position in positions:
        if not np.isfinite(values[position]).any():
            continue  # nothing to draw (a run without this curve: no baseline, no sketch)
        for cluster in clusters:
            if np.array_equal(values[cluster[0]], values[position], equal_nan=True):
                cluster.append(position)
                break
        else:
            clusters.append([position])
    return clusters


def reference_levels(curve: str, data_ranks: float, tp: float = 1, pp: float = 1) -> list[tuple[float, str]]:
    """The levels a curve is read against, labelled: 1 (the baseline's) and 1/W (without the loss's all-reduce;
    W / tp, W / pp or W / (tp x pp), the data ranks, under tensor or pipeline parallelism) for the gradient scale
    k, 1 for the cosine."""
    if curve == "sketch_scale":
        levels = [(1.0, "1 (the baseline's)")]
        if np.isfinite(data_ranks) and data_ranks > 1:
            split = [axis for axis, size in (("tp", tp), ("pp", pp)) if size > 1]
            over = "1/W" if not split else f"1/(W/{split[0]})" if len(split) == 1 else "1/(W/(tp x pp))"
            levels.append((1.0 / data_ranks, f"{over} = 1/{data_ranks:g}"))
        return levels
    if curve == "sketch_cos":
        return [(1.0, "1 (same direction)")]
    return []


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
    ran = curves["logged"].any(axis=1)  # a run that logged no step has no curve, and a group of such runs no panel
    own_baseline = (runs["run"] == runs["baseline"]).to_numpy()
    figures = [
        figure for figure in CURVE_FIGURES if figure.curve in curves and _has_curve(figure, curves, own_baseline)
    ]
    plotted = (ran & runs["group"].isin(plotted_groups(runs[ran])).to_numpy()) if ran.any() else ran
    members = (
        runs.loc[plotted, ["group", "group_label", "run", "baseline", "reduction"]]
        .assign(  # the 1/W line's W
            data_ranks=data_ranks(runs.loc[plotted]),
            tp=runs.loc[plotted].get("tp", 1),
            pp=runs.loc[plotted].get("pp", 1),
        )
        .astype(object)
        .reset_index(drop=True)
    )
    return (
        [(draw_curve_figures, (members, {f.curve: curves[f.curve][plotted] for f in figures}, figures, out))]
        if figures
        else []
    )


def _has_curve(figure: CurveFigure, curves: dict[str, np.ndarray], own_baseline: np.ndarray) -> bool:
    """Whether `figure` has something to show: a finite value of a run against a baseline other than itself
    (the loss: of any run). No baseline, no difference figure: raw losses are no difference."""
    values = curves[figure.curve]
    against = values if figure.curve == "loss" else values[~own_baseline]
    return bool(np.isfinite(against).any())


def curve_figure_paths(curves: dict[str, np.ndarray], out: Path, runs: pd.DataFrame | None = None) -> list[Path]:
    """The files `curve_figure_jobs` draws, in its order."""
    own = (runs["run"] == runs["baseline"]).to_numpy() if runs is not None else np.zeros(len(curves["logged"]), bool)
    return [out / figure.file for figure in CURVE_FIGURES if figure.curve in curves and _has_curve(figure, curves, own)]


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
    width = max((len(_label(run)) for _, run in shown.iterrows()), default=1)
    # Per figure: each panel's curves in clusters of identical ones, and their legend entries.
    drawn = {}
    for figure in figures:
        clusters = {group: identical_curves(curves[figure.curve], _drawing_order(runs, group)) for group in groups}
        entries = [_joined([_label(runs.iloc[i]) for i in c], max(width, 40)) for cs in clusters.values() for c in cs]
        drawn[figure.file] = clusters, list(dict.fromkeys(entries))
    legends = {name: _legend_grid(entries, _width(len(groups))) for name, (_, entries) in drawn.items()}
    colours = colours_for(shown["reduction"])
    fig, axes = _panels(len(groups), legend_rows=max((rows for _, rows in legends.values()), default=1))
    last_step = next(iter(curves.values())).shape[1] if curves else 1  # the steps the arrays hold
    for ax, group in zip(axes, groups):
        _style_panel(ax, runs.loc[runs["group"] == group, "group_label"].iloc[0], last_step)
    paths = []
    for figure in figures:
        clusters = drawn[figure.file][0]
        _draw_curves(fig, axes, runs, clusters, curves[figure.curve], figure, legends[figure.file][0], colours, width)
        paths.append(save(fig, out / figure.file))
    plt.close(fig)
    return paths


def _drawing_order(runs: pd.DataFrame, group: str) -> list[int]:
    """A group's runs (rows of `runs`): the baseline first (a cluster of identical curves is named from it, and
    drawn dashed), then in the modes' order."""
    members = runs[runs["group"] == group]
    order = sorted(
        members.index, key=lambda r: (runs.at[r, "run"] != runs.at[r, "baseline"], label_order(runs.at[r, "reduction"]))
    )
    return [runs.index.get_loc(r) for r in order]


def _style_panel(ax, label: str, last_step: int) -> None:
    ax.set_title(label, fontsize=9, y=1.0)  # a fixed y skips matplotlib's costly automatic title placement
    ax.set_xlabel("step")
    style_axes(ax, integer_x=True)
    step_axis(ax, last_step)


def _label(run) -> str:
    return f"{run['reduction']} (baseline)" if run["run"] == run["baseline"] else str(run["reduction"])


def _draw_curves(
    fig,
    axes,
    runs: pd.DataFrame,
    clusters: dict[str, list[list[int]]],
    values: np.ndarray,
    figure: CurveFigure,
    columns: int,
    colours,
    width: int,
) -> None:
    """values[run, step] as one line per run in its group's panel (baseline dashed), in place of the last figure's."""
    for legend in fig.legends[:]:
        legend.remove()
    steps = np.arange(1, values.shape[1] + 1)
    for ax, (group, identical) in zip(axes, clusters.items()):
        for line in ax.get_lines()[:]:
            line.remove()
        for text in ax.texts[:]:
            text.remove()
        members = runs[runs["group"] == group]
        for cluster in identical:
            run = runs.iloc[cluster[0]]
            curve = values[cluster[0]]
            few = np.isfinite(curve).sum() <= FEW_POINTS  # a short curve shows its points (one point: a marker)
            ax.plot(
                steps,
                curve,
                "--" if run["run"] == run["baseline"] else "-",
                color=colours.get(run["reduction"], "grey"),
                lw=1.2,
                marker="o" if few else None,
                markersize=3.5,
                label=_joined([_label(runs.iloc[i]) for i in cluster], max(width, 40)),  # coinciding curves, named
            )
        ax.relim()
        ax.autoscale(axis="y")  # the x axis is the steps' (`step_axis`)
        first = members.iloc[0]
        for level, name in reference_levels(figure.curve, first["data_ranks"], first["tp"], first["pp"]):
            reference_line(ax, level, name)
        widen_to(ax, figure.min_span)
        ax.set_ylabel(figure.ylabel)
    fig.suptitle(figure.title, y=1 - 0.15 / fig.get_figheight(), va="top")  # a second call replaces the first
    handles = {h.get_label(): h for ax in axes for h in ax.get_lines() if h.get_gid() != REFERENCE}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=columns, frameon=False, fontsize=9)
