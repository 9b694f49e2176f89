"""report.md: the title, the answer, the training sections (each only where this analysis has its data), the
cost section and the plots, in that order."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.gradients.tolerances import Tolerances
from analysis.plots.curves import CURVE_FIGURES
from analysis.plots.figures import MAX_GROUPS
from analysis.report.communication import communication_section
from analysis.report.cost import cost_section
from analysis.report.invariance import invariance_section
from analysis.report.post_training import CAPTION as POST_TRAINING_CAPTION
from analysis.report.verdicts import incomplete_section, verdicts_section


def training_sections(
    runs: pd.DataFrame,
    verdicts: pd.DataFrame,
    comm: pd.DataFrame,
    invariance: pd.DataFrame,
    invariance_summary: pd.DataFrame,
    tol: Tolerances,
) -> list[str]:
    """Verdicts, runs that did not complete, layout invariance, communication: each opens with its answer."""
    return (
        verdicts_section(verdicts, tol)
        + incomplete_section(runs)
        + invariance_section(invariance, invariance_summary)
        + communication_section(comm)
    )


def write_report(
    out: Path,
    sweeps: list[Path],
    answer: str,
    body: list[str],
    plots: list[Path],
    cost: pd.DataFrame | None = None,
    floor: pd.DataFrame | None = None,
    groups: int = 0,
    notes: list[str] | None = None,
) -> Path:
    """report.md: the title, `answer`, the training sections in `body`, the cost section and the plots."""
    sections = [f"# Loss-reduction ablation: {', '.join(s.name for s in sweeps)}", "", answer]
    left_out = [note for note in notes or [] if "cost job" not in note]  # the cost section says those
    if left_out:
        sections += ["", "Left out of this analysis: " + "; ".join(left_out) + "."]
    sections += body
    sections += cost_section(cost, floor, sweeps, notes)
    if plots:
        captions = {figure.file: figure.caption for figure in CURVE_FIGURES} | {
            "post_training.png": POST_TRAINING_CAPTION
        }
        for plot in plots:
            sections += [f"![{plot.stem}]({plot.name})", ""] + (
                [captions[plot.name], ""] if plot.name in captions else []
            )
        if groups > MAX_GROUPS:
            sections += ["", f"The plots show the first {MAX_GROUPS} of {groups} groups; the tables hold all of them."]
    path = out / "report.md"
    path.write_text("\n".join(sections).rstrip("\n") + "\n")
    return path
