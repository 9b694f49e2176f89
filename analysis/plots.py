"""PNG plots of a sweep's analysis (matplotlib, no display needed).

- loss_curves.png: the loss of every mode per comparison group, baseline dashed
- loss_difference.png: each run's loss minus its baseline's, per step
- gradient_scale.png / gradient_direction.png: sketch scale k and cosine
  against the baseline per step (k = 1/W is a flat line for local/detached)
- comm_overhead.png: loss all-reduces per step, and step time against `local`
  from jobs run one after another (machine drift included: not the cost)
- interleaved_cost.png: each mode's time against `local` on the same steps
  (the cost the report states), with the null control's reach shaded

One panel per comparison group, at most MAX_GROUPS of them (the report says
when groups were left out).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from runner.modes import COLOURS, MODES  # noqa: E402

MAX_GROUPS = 16
COLORS = COLOURS  # one colour per mode, from the modes' facts


def plotted_groups(runs: pd.DataFrame) -> list[str]:
    order = runs.drop_duplicates("group").sort_values(["group_label", "group"])
    return order["group"].tolist()[:MAX_GROUPS]


# Panel and margin sizes in inches; the figure grows with the panel grid.
PANEL_W, PANEL_H = 4.2, 3.0
LEFT, RIGHT, TOP, BOTTOM = 0.8, 0.2, 0.7, 0.9  # BOTTOM holds the last row's x label and the legend


def _panels(count: int):
    """A grid of `count` panels, 4 wide at most, with fixed margins (tight_layout would draw it all twice)."""
    cols = min(count, 4)
    rows = math.ceil(count / cols)
    width = LEFT + RIGHT + PANEL_W * cols + 0.6 * (cols - 1)
    height = TOP + BOTTOM + PANEL_H * rows + 0.6 * (rows - 1)
    fig, axes = plt.subplots(rows, cols, figsize=(width, height), squeeze=False, sharex=True)
    fig.subplots_adjust(
        left=LEFT / width,
        right=1 - RIGHT / width,
        bottom=BOTTOM / height,
        top=1 - TOP / height,
        wspace=0.6 / PANEL_W,
        hspace=0.6 / PANEL_H,
    )
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat)[:count]


# The per-group figures: (curve in `measure`'s curves, file, title, y label), in report order.
CURVE_FIGURES = [
    ("loss", "loss_curves.png", "Loss per comparison group (dashed: baseline)", "loss"),
    ("loss_diff", "loss_difference.png", "Loss minus the baseline's loss", "Δ loss"),
    # Step 1 is the clean factor (same parameters); later steps compare gradients
    # at parameters that have drifted apart unless the runs are equivalent.
    ("sketch_scale", "gradient_scale.png", "Gradient scale k against the baseline (sketch)", "k"),
    (
        "sketch_cos",
        "gradient_direction.png",
        "Gradient direction: cosine with the baseline (after step 1, runs that train differently have drifted apart)",
        "cosine",
    ),
]


def curve_figure_jobs(runs: pd.DataFrame, curves: dict[str, np.ndarray], out: Path) -> list[tuple]:
    """The CURVE_FIGURES whose curve is in `curves` (no sketch: no gradient figures), one panel per group, as
    jobs (`draw_curve_figures`, its arguments): one job, all figures on one grid of panels (making a grid
    of 16 panels costs about a fifth of the drawing, and the forked process runs its jobs one after
    another anyway). The arguments are the plotted runs as plain Python objects and their curves as
    arrays, so that a forked process (analysis.background) can draw them without running Arrow code."""
    figures = [figure for figure in CURVE_FIGURES if figure[0] in curves]
    plotted = runs["group"].isin(plotted_groups(runs)).to_numpy()
    members = (
        runs.loc[plotted, ["group", "group_label", "run", "baseline", "reduction"]]
        .astype(object)
        .reset_index(drop=True)
    )
    return (
        [(draw_curve_figures, (members, {curve: curves[curve][plotted] for curve, *_ in figures}, figures, out))]
        if figures
        else []
    )


def curve_figure_paths(curves: dict[str, np.ndarray], out: Path) -> list[Path]:
    """The files `curve_figure_jobs` draws, in its order."""
    return [out / name for curve, name, *_ in CURVE_FIGURES if curve in curves]


def curves_per_group(runs: pd.DataFrame, curves: dict[str, np.ndarray], out: Path) -> list[Path]:
    """The per-group figures (see `curve_figure_jobs`), drawn in this process."""
    return [path for draw, args in curve_figure_jobs(runs, curves, out) for path in draw(*args)]


def draw_curve_figures(
    runs: pd.DataFrame, curves: dict[str, np.ndarray], figures: list[tuple[str, str, str, str]], out: Path
) -> list[Path]:
    """`figures` (CURVE_FIGURES entries) drawn on one grid of panels, one figure after another.

    Making the axes and their ticks is most of a figure's cost, so it is paid once,
    and each figure only replaces the previous one's curves, legend, title and y
    labels before it is saved.
    """
    groups = plotted_groups(runs)
    fig, axes = _panels(len(groups))
    for ax, group in zip(axes, groups):
        _style_panel(ax, runs.loc[runs["group"] == group, "group_label"].iloc[0])
    paths = []
    for curve, name, title, ylabel in figures:
        _draw_curves(fig, axes, runs, groups, curves[curve], title, ylabel)
        fig.savefig(out / name, dpi=100)
        paths.append(out / name)
    plt.close(fig)
    return paths


def _style_panel(ax, label: str) -> None:
    ax.set_title(label, fontsize=9, y=1.0)  # a fixed y skips matplotlib's costly automatic title placement
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    # Few ticks: every tick is a Text artist, and making them is most of a figure's cost.
    ax.xaxis.set_major_locator(MaxNLocator(4))
    ax.yaxis.set_major_locator(MaxNLocator(4))


def _draw_curves(fig, axes, runs: pd.DataFrame, groups: list[str], values: np.ndarray, title: str, ylabel: str) -> None:
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
            style = "--" if run["run"] == run["baseline"] else "-"
            ax.plot(
                steps,
                values[position],
                style,
                color=COLORS.get(run["reduction"], "grey"),
                lw=1.2,
                label=run["reduction"],
            )
        ax.relim()
        ax.autoscale()  # the limits of these curves, computed when the figure is drawn
        ax.set_ylabel(ylabel)
    fig.suptitle(title, y=1 - 0.15 / fig.get_figheight(), va="top")  # a second call replaces the first
    handles = {h.get_label(): h for ax in axes for h in ax.get_lines()}
    columns = min(len(handles), 3 * min(len(groups), 4))
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=columns, frameon=False, fontsize=9)


def comm_overhead(comm: pd.DataFrame, out: Path) -> Path:
    table = comm[comm["group"].isin(plotted_groups(comm))].sort_values(["group_label", "reduction"])
    labels = table["group_label"].drop_duplicates().tolist()
    modes = [m for m in MODES if m in set(table["reduction"])]
    width = 0.8 / max(len(modes), 1)
    fig, (calls_ax, time_ax) = plt.subplots(2, 1, figsize=(max(7, 1.6 * len(labels) + 2), 7), sharex=True)
    x = np.arange(len(labels))
    for i, mode in enumerate(modes):
        one = table[table["reduction"] == mode].set_index("group_label").reindex(labels)
        offset = x + (i - (len(modes) - 1) / 2) * width
        calls_ax.bar(offset, one["loss_all_reduce_calls"], width, color=COLORS[mode], label=mode)
        error = np.abs(one[["overhead_ci_low", "overhead_ci_high"]].to_numpy().T - one["overhead_vs_local"].to_numpy())
        time_ax.bar(offset, one["overhead_vs_local"], width, yerr=error, color=COLORS[mode], capsize=2)
    if table["loss_all_reduce_calls"].isna().all():
        calls_ax.text(
            0.5, 0.5, "not recorded (runs without loss_comm)", ha="center", va="center", transform=calls_ax.transAxes
        )
    calls_ax.set_ylabel("loss all-reduces / step")
    fig.legend(
        *calls_ax.get_legend_handles_labels(),
        loc="upper center",
        bbox_to_anchor=(0.5, 0.95),
        ncol=min(len(modes), 6),
        fontsize=8,
        frameon=False,
    )
    time_ax.axhline(1.0, color="grey", lw=0.8)
    time_ax.set_ylabel("step time / local's\n(sequential jobs: drift included)")
    time_ax.set_xticks(x, labels, rotation=20, ha="right", fontsize=8)
    for ax in (calls_ax, time_ax):
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Communication cost of each mode")
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.17, top=0.88, hspace=0.08)
    path = out / "comm_overhead.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def interleaved_cost(cost: pd.DataFrame, out: Path) -> Path:
    """Each mode's forward+backward time over `local`'s, per cost job, with the null band shaded."""
    jobs = cost["job"].drop_duplicates().tolist()
    fig, axes = plt.subplots(1, len(jobs), figsize=(4.8 * len(jobs) + 0.6, 3.6), squeeze=False)
    for ax, job in zip(axes[0], jobs):
        rows = cost[cost["job"] == job].set_index("mode")
        modes = [m for m in MODES if m in rows.index]
        one = rows.loc[modes]
        error = np.abs(one[["ci_low", "ci_high"]].to_numpy().T - one["ratio"].to_numpy())
        ax.bar(range(len(modes)), one["ratio"], yerr=error, color=[COLORS[m] for m in modes], capsize=3)
        resolution = one["resolution"].iloc[0]
        if np.isfinite(resolution):
            ax.axhspan(1 - resolution, 1 + resolution, color="grey", alpha=0.2, label="null control's reach")
        ax.axhline(1.0, color="grey", lw=0.8)
        low = min(one["ci_low"].min(), 1 - (resolution if np.isfinite(resolution) else 0))
        ax.set_ylim(max(0, low - 0.05), max(one["ci_high"].max(), 1) + 0.05)
        ax.set_xticks(range(len(modes)), modes, rotation=20, ha="right", fontsize=8)
        layout = f"W={rows['world_size'].iloc[0]}, sp={rows['sp'].iloc[0]}, GA={rows['grad_accum'].iloc[0]}"
        ax.set_title(f"{layout}: {int(rows['steps'].iloc[0])} paired steps", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("fwd+bwd time / local's (95% CI)")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.suptitle("Interleaved cost: each mode against local on the same steps")
    fig.tight_layout()
    path = out / "interleaved_cost.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
