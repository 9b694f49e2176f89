"""report.md after its answer: the tables and plots, each section only where this analysis has its data."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.comm import WARMUP_STEPS
from analysis.compare import Tolerances
from analysis.plots import CURVE_FIGURES, MAX_GROUPS
from analysis.report_cost import cost_section
from runner.modes import label_order

VERDICT_COLUMNS = {
    "group_label": "group",
    "reduction": "mode",
    "verdict_text": "verdict",
    "expected": "expected",
    "sketch_cos_step1": "cos@1",
    "factor": "scale@1",
    "grad_norm_ratio_median": "|g| ratio (median)",
    "loss_max_abs_diff": "max |Δloss|",
    "final_loss_diff": "final Δloss",
    "first_step_beyond": "departs at",
    "clip_active_frac": "clipped",
}
# comm.csv's per-run counts (the report's communication table); its step-time columns get a table of their own.
COUNT_COLUMNS = [
    "group_label", "reduction", "loss_all_reduce_calls", "loss_all_reduce_bytes", "loss_all_reduce_latency_ms",
    "total_calls", "total_bytes", "total_comm_latency_ms", "extra_loss_calls_vs_local",
]  # fmt: skip
TIME_COLUMNS = ["group_label", "reduction", "step_ms_median", "peer_skew_ms_median", "overhead_vs_local",
                "overhead_ci_low", "overhead_ci_high"]  # fmt: skip


def table(frame: pd.DataFrame, empty: str = "(none)") -> str:
    return frame.to_markdown(index=False, floatfmt=".4g", missingval="") if len(frame) else empty


def by_mode(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows by group, then in the modes' order (sum first, the negative control last)."""
    order = frame["reduction"].map(label_order)  # sum[...] after sum, custom callables last
    return frame.assign(_order=order).sort_values(["group_label", "_order"]).drop(columns="_order")


def training_sections(
    runs: pd.DataFrame, verdicts: pd.DataFrame, comm: pd.DataFrame, invariance: pd.DataFrame, tol: Tolerances
) -> list[str]:
    """Verdicts, runs that did not complete, layout invariance, communication."""
    not_ok = runs[runs["status"] != "completed"]
    sections = [
        "## Verdicts",
        "",
        table(by_mode(verdicts)[list(VERDICT_COLUMNS)].rename(columns=VERDICT_COLUMNS)),
        "",
        f"Tolerances: loss curves match while |Δloss| <= {tol.loss_rtol:g} × the baseline's loss; "
        f"the direction is the same while 1 - cos <= {tol.cos_tol:g} (gradient sketch at step 1); "
        f"the scale is unchanged while |k - 1| <= {tol.scale_rtol:g}. Every number and its reason: verdicts.csv.",
        "",
    ]
    if len(not_ok):
        sections += [
            "## Runs that did not complete",
            "",
            table(not_ok[["run", "status", "steps_done", "diverged_at", "error"]]),
            "",
        ]
    sections += ["## Invariance to the layout", ""]
    if invariance.empty:
        sections += ["Every config ran in one layout: sweep world_size, sp or grad_accum to see this.", ""]
    else:
        sections += [
            table(invariance.drop(columns=["family"]) if invariance["family"].nunique() <= 1 else invariance),
            "",
        ]
    return sections + communication_section(comm)


def communication_section(comm: pd.DataFrame) -> list[str]:
    ordered = by_mode(comm)
    sections = [
        "## Communication per step",
        "",
        table(ordered[COUNT_COLUMNS]),
        "",
        "Loss all-reduces: those of forward/backward (the valid-token count N and the mode's own), counted "
        "exactly on the sampled steps. Latency: the counter's issue-to-completion time, which includes waiting "
        "for the slowest peer, so it is not a collective's own cost (the interleaved measurement's floor is).",
        "",
    ]
    if ordered["step_ms_median"].isna().all():
        return sections + [
            f"Step times: none, as every run is shorter than the {WARMUP_STEPS} warm-up steps left out of them.",
            "",
        ]
    return sections + [
        "Step times of jobs run one after another (the world's, median over the steps after the first "
        f"{WARMUP_STEPS}), against the matching `local` runs. Those ran minutes apart, so these ratios hold "
        "machine drift, which their CIs (over steps) do not cover: they are not a cost, and the report states "
        "none from them.",
        "",
        table(ordered[TIME_COLUMNS]),
        "",
    ]


def write_report(
    out: Path,
    sweeps: list[Path],
    answer: str,
    body: list[str],
    plots: list[Path],
    cost: pd.DataFrame | None = None,
    floor: pd.DataFrame | None = None,
    groups: int = 0,
) -> Path:
    """report.md: the title, `answer`, the training sections in `body`, the cost section and the plots."""
    sections = [f"# Loss-reduction ablation: {', '.join(s.name for s in sweeps)}", "", answer, *body]
    sections += cost_section(cost, floor, sweeps)
    if plots:
        captions = {figure.file: figure.caption for figure in CURVE_FIGURES}
        for plot in plots:
            sections += [f"![{plot.stem}]({plot.name})", ""] + (
                [captions[plot.name], ""] if plot.name in captions else []
            )
        if groups > MAX_GROUPS:
            sections += ["", f"The plots show the first {MAX_GROUPS} of {groups} groups; the tables hold all of them."]
    path = out / "report.md"
    path.write_text("\n".join(sections).rstrip("\n") + "\n")
    return path
