"""What every plot of the analysis shares: the groups drawn, plain tick labels, a y range no narrower than the
figure's tolerance, one save, and the check that a figure is legible (tests/test_plots.py runs it on every plot).

Legible means: no axis shows an offset or a multiplier (`1e-7+1`: float noise drawn as large swings);
every title, label and tick label lies inside the figure; the figure's title overlaps no panel's title.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

MAX_GROUPS = 16  # panels (comparison groups) a figure shows at most; the report says when groups were left out

# Tick labels in at most 6 significant digits and never an offset: 1.0005, 0.0025, 1e-07.
PLAIN = FuncFormatter(lambda value, _: f"{value:.6g}")


def plotted_groups(runs: pd.DataFrame) -> list[str]:
    """The comparison groups a figure shows: the first MAX_GROUPS by label."""
    order = runs.drop_duplicates("group").sort_values(["group_label", "group"])
    return order["group"].tolist()[:MAX_GROUPS]


def style_axes(ax, *, integer_x: bool = False) -> None:
    """Few ticks (every tick is a Text artist, most of a figure's cost), plain labels, a light grid."""
    ax.xaxis.set_major_locator(MaxNLocator(4, integer=integer_x))
    ax.yaxis.set_major_locator(MaxNLocator(4))
    ax.yaxis.set_major_formatter(PLAIN)
    if not integer_x:
        ax.xaxis.set_major_formatter(PLAIN)
    ax.grid(alpha=0.3)


REFERENCE = "reference"  # the gid of a reference line (1, 1/W): drawn and labelled, not a curve of the legend


def step_axis(ax, last_step: int) -> None:
    """An x axis of whole steps: integer ticks only, and room around a run of one or two steps (whose axis would
    otherwise span 0.96 to 1.04 and be ticked in fractions)."""
    ax.xaxis.set_major_locator(MaxNLocator(4, integer=True, min_n_ticks=1))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.0f}"))
    ax.set_xlim(*((0.5, last_step + 0.5) if last_step <= 3 else (1, last_step)))  # step 0 is no step


def reference_line(ax, level: float, name: str) -> None:
    """A thin horizontal line at `level`, its name written on it at the panel's right end."""
    ax.axhline(level, color="0.55", lw=0.8, ls=":", gid=REFERENCE, zorder=0)
    ax.annotate(
        name, xy=(1, level), xycoords=("axes fraction", "data"), xytext=(-3, 2), textcoords="offset points",
        ha="right", va="bottom", fontsize=7, color="0.35",
    )  # fmt: skip
    low, high = ax.get_ylim()
    if not low <= level <= high:  # the level in view, so its label is
        ax.set_ylim(min(low, level), max(high, level))


def widen_to(ax, span: float) -> None:
    """A y range of at least `span` around the data: differences below it (float noise, or within the
    comparison's tolerance) are drawn flat instead of filling the panel."""
    low, high = ax.get_ylim()
    if span > 0 and high - low < span:
        middle = (low + high) / 2
        ax.set_ylim(middle - span / 2, middle + span / 2)


def save(fig, path: Path, dpi: int = 100) -> Path:
    """Every figure of the analysis is written here."""
    fig.savefig(path, dpi=dpi)
    return path


def legibility_problems(fig) -> list[str]:
    """What makes `fig` hard to read, as sentences (empty when it is fine); draws the figure once."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = fig.bbox
    problems = []

    def outside(text, what: str) -> None:
        if not text.get_visible() or not text.get_text():
            return
        box = text.get_window_extent(renderer)
        if box.x0 < frame.x0 - 1 or box.x1 > frame.x1 + 1 or box.y0 < frame.y0 - 1 or box.y1 > frame.y1 + 1:
            problems.append(f"{what} {text.get_text()!r} is cut off at the figure's edge")

    for ax in fig.axes:
        if not ax.get_visible():
            continue
        name = ax.get_title() or "a panel"
        for axis in (ax.xaxis, ax.yaxis):
            offset = axis.get_offset_text().get_text()
            if offset:
                problems.append(f"{name}: its {axis.axis_name} axis shows an offset or multiplier ({offset})")
        outside(ax.title, "the title")
        outside(ax.xaxis.label, f"{name}: the x label")
        outside(ax.yaxis.label, f"{name}: the y label")
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks():  # those beyond the view are not drawn
                if low - 1e-9 * abs(high - low) <= tick.get_loc() <= high + 1e-9 * abs(high - low):
                    outside(tick.label1, f"{name}: the tick label")
        suptitle = fig._suptitle
        if (
            suptitle is not None
            and ax.title.get_text()
            and suptitle.get_window_extent(renderer).overlaps(ax.title.get_window_extent(renderer))
        ):
            problems.append(f"the figure's title overlaps the panel title {name!r}")
    if fig._suptitle is not None:
        outside(fig._suptitle, "the figure's title")
    for legend in fig.legends:
        for text in legend.get_texts():
            outside(text, "the legend entry")
    return problems
