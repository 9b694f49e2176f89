"""The cost plots of an analysis (matplotlib, no display needed).

- comm_overhead.png: each mode's loss all-reduces per step (counted: exact); no
  step time of jobs run one after another, which no inference holds
- interleaved_cost.png: each mode's time against `local` on the same steps
  (the cost the report states), with the null control's reach shaded
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from analysis.plots.figures import plotted_groups, save, style_axes  # noqa: E402
from runner.modes import COLOURS, MODES  # noqa: E402


def counted_modes(comm: pd.DataFrame) -> list[str]:
    """The built-in modes whose loss all-reduces were counted, in the modes' order; the figure compares them
    (the analysis draws it for two or more)."""
    counted = set(comm.loc[comm["loss_all_reduce_calls"].notna(), "reduction"])
    return [m for m in MODES if m in counted]


def comm_overhead(comm: pd.DataFrame, out: Path) -> Path:
    """Each mode's loss all-reduces per step, per comparison group: counted, exact. No step time: those of jobs
    run one after another hold the machine's load as much as the mode (`analysis.cost.comm`)."""
    table = comm[comm["group"].isin(plotted_groups(comm))].sort_values(["group_label", "reduction"])
    labels = table["group_label"].drop_duplicates().tolist()
    modes = [m for m in MODES if m in set(table["reduction"])]
    width = 0.8 / max(len(modes), 1)
    fig, calls_ax = plt.subplots(figsize=(max(7, 1.6 * len(labels) + 2), 4.2))
    x = np.arange(len(labels))
    for i, mode in enumerate(modes):
        # A group may hold several runs of one mode (train.steps=3,4): their counts per step are one count.
        one = table[table["reduction"] == mode].groupby("group_label", sort=False).max(numeric_only=True)
        one = one.reindex(labels)
        offset = x + (i - (len(modes) - 1) / 2) * width
        calls_ax.bar(offset, one["loss_all_reduce_calls"], width, color=COLOURS[mode], label=mode)
    if table["loss_all_reduce_calls"].isna().all():
        calls_ax.text(
            0.5, 0.5, "not recorded (runs without loss_comm)", ha="center", va="center", transform=calls_ax.transAxes
        )
    calls_ax.set_ylabel("loss all-reduces / step")
    fig.legend(
        *calls_ax.get_legend_handles_labels(),
        loc="upper center",
        bbox_to_anchor=(0.5, 0.93),
        ncol=min(len(modes), 6),
        fontsize=8,
        frameon=False,
    )
    style_axes(calls_ax)
    calls_ax.yaxis.set_major_locator(MaxNLocator(5, integer=True))  # calls are whole numbers
    calls_ax.set_xticks(x, [label.replace(" ", "\n") for label in labels], fontsize=8)  # one setting a line
    fig.suptitle("Loss all-reduces per step of each mode (counted)")
    fig.tight_layout(rect=(0, 0, 1, 0.93))  # one figure, drawn once: the labels' room is measured
    path = save(fig, out / "comm_overhead.png", dpi=110)
    plt.close(fig)
    return path


def interleaved_cost(cost: pd.DataFrame, out: Path) -> Path:
    """Each mode's forward+backward time over `local`'s per cost job: the Hodges-Lehmann ratio and its 95% CI;
    filled where the exact test resolves it, hollow where not, grey for the null control."""
    jobs = cost["job"].drop_duplicates().tolist()
    fig, axes = plt.subplots(1, len(jobs), figsize=(4.8 * len(jobs) + 0.6, 3.6), squeeze=False)
    for ax, job in zip(axes[0], jobs):
        rows = cost[cost["job"] == job].set_index("mode")
        modes = [m for m in MODES if m in rows.index]
        for x, mode in enumerate(modes):
            row = rows.loc[mode]
            null = row["role"] == "null control"
            colour = "grey" if null else COLOURS[mode]
            filled = row["verdict"] == "resolved" or (null and row["verdict"] == "null: differs")
            ax.errorbar(
                x, row["ratio"], yerr=[[row["ratio"] - row["ci_low"]], [row["ci_high"] - row["ratio"]]],
                fmt="o", color=colour, markerfacecolor=colour if filled else "white", capsize=4, markersize=7,
            )  # fmt: skip
        ax.axhline(1.0, color="grey", lw=0.8)
        low, high = rows.loc[modes, "ci_low"].min(), rows.loc[modes, "ci_high"].max()
        margin = max(0.01, 0.1 * (high - low))
        ax.set_ylim(min(low, 1) - margin, max(high, 1) + margin)
        ax.set_xlim(-0.5, len(modes) - 0.5)
        style_axes(ax)
        ax.set_xticks(range(len(modes)), modes, rotation=20, ha="right", fontsize=8)
        layout = f"W={rows['world_size'].iloc[0]}, sp={rows['sp'].iloc[0]}, GA={rows['grad_accum'].iloc[0]}"
        for axis in ("tp", "pp"):  # absent from (or NaN in) the tables of configs written before the key
            size = rows[axis].iloc[0] if axis in rows else 1
            layout += f", {axis}={size:g}" if size > 1 else ""
        ax.set_title(f"{layout}: {int(rows['steps'].iloc[0])} paired steps", fontsize=9)
    axes[0][0].set_ylabel("fwd+bwd time / local's\n(95% CI, exact test)")
    fig.suptitle(
        "Interleaved cost against local on the same steps\n(filled: resolved; grey: null control)", fontsize=11
    )
    fig.tight_layout()
    path = save(fig, out / "interleaved_cost.png", dpi=110)
    plt.close(fig)
    return path
