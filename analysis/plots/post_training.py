"""post_training.png: the post-training modes x the layouts, each cell the mode's step-1 gradient at that layout
against its own at W=1 grad_accum=1: the same, ×k, or another direction (with the cosine).

One row per mode (named as its trainer or paper calls it, with what it weighs alike), one column per layout
(DP(dp)-SP(sp)-GA(grad_accum), at integer positions); the colour says which of the three, the text the number.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from analysis.gradients.verdicts import factor_label
from analysis.plots.figures import save

# (what a cell shows, its colour), in the legend's order.
KINDS = {
    "baseline": ("W=1, grad_accum=1 (the mode's own baseline)", "#d9d9d9"),
    "same": ("the same gradient", "#a1d99b"),
    "rescaled": ("×k: the same direction, k times as large", "#fdd0a2"),
    "turned": ("another direction (cosine)", "#fc9272"),
    "none": ("not compared (failed, not run or no baseline)", "#ffffff"),
}
KIND_INDEX = {kind: i for i, kind in enumerate(KINDS)}


def _cell(row: pd.Series) -> tuple[str, str]:
    """(kind, text) of one run's cell."""
    verdict = row["verdict"]
    if verdict == "reference":
        return "baseline", "W=1"
    if verdict in ("identical", "equivalent"):
        return "same", "same"
    if verdict == "rescaled":
        return "rescaled", f"×{factor_label(row['scale'])}"
    if verdict == "different":
        cos = row["cos"]
        return "turned", f"cos {cos:.3f}" if np.isfinite(cos) and cos < 1 else "departs"
    return "none", verdict


def _layout_order(runs: pd.DataFrame) -> list[str]:
    """DP(1)-SP(1)-GA(1) first, then by total processes x steps, grad_accum before dp before sp."""
    order = runs.drop_duplicates("layout").assign(size=runs["dp"] * runs["sp"] * runs["grad_accum"])
    return order.sort_values(["size", "sp", "dp", "grad_accum"])["layout"].tolist()


def post_training_figure(layouts: pd.DataFrame, rl: pd.DataFrame):
    """The figure (the caller saves it; tests check it): `layouts` is rl_runs.csv's table, `rl` rl.csv's."""
    modes = rl.drop_duplicates("reduction")
    columns = _layout_order(layouts)
    kinds = np.full((len(modes), len(columns)), KIND_INDEX["none"])
    texts = [["not run"] * len(columns) for _ in range(len(modes))]
    row_of = {mode: i for i, mode in enumerate(modes["reduction"])}
    for _, run in layouts.iterrows():
        if run["reduction"] not in row_of:
            continue
        kind, text = _cell(run)
        i, j = row_of[run["reduction"]], columns.index(run["layout"])
        kinds[i, j], texts[i][j] = KIND_INDEX[kind], text

    fig, ax = plt.subplots(figsize=(2.1 * len(columns) + 4.2, 0.42 * len(modes) + 2.4))
    colours = ListedColormap([colour for _, colour in KINDS.values()])
    ax.imshow(kinds, cmap=colours, vmin=-0.5, vmax=len(KINDS) - 0.5, aspect="auto")
    for i in range(len(modes)):
        for j in range(len(columns)):
            ax.text(j, i, texts[i][j], ha="center", va="center", fontsize=8)
    ax.set_xticks(np.arange(len(columns)), columns, fontsize=8)
    labels = [
        f"{name} ({unit})" if isinstance(unit, str) else name for name, unit in zip(modes["mode"], modes["weighs"])
    ]
    ax.set_yticks(np.arange(len(modes)), labels, fontsize=8)
    ax.set_xticks(np.arange(len(columns) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(modes) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("layout: DP(data-parallel ranks)-SP(sequence-parallel ranks)-GA(accumulation steps)", fontsize=8)
    ax.set_ylabel("mode (what its objective weighs alike at W=1)", fontsize=8)
    ax.set_title("Step-1 gradient against the same mode at W=1, grad_accum=1", fontsize=10)
    used = sorted(set(kinds.ravel()))
    handles = [
        Patch(facecolor=KINDS[k][1], edgecolor="grey", label=KINDS[k][0]) for k in KINDS if KIND_INDEX[k] in used
    ]
    fig.legend(handles=handles, loc="lower center", ncol=min(3, len(handles)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.09 if len(handles) > 3 else 0.06, 1, 1))
    return fig


def post_training_plot(layouts: pd.DataFrame, rl: pd.DataFrame, out: Path) -> Path:
    path = out / "post_training.png"
    fig = post_training_figure(layouts, rl)
    try:
        return save(fig, path)
    finally:
        plt.close(fig)
