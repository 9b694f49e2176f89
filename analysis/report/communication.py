"""The report's "Communication per step" section: how many more loss all-reduces a mode issues than `local` (its
answer), comm.csv's collective counts, and its step times."""

from __future__ import annotations

import pandas as pd

from analysis.cost.comm import WARMUP_STEPS
from analysis.report.markdown import by_mode, span, table
from runner.modes import with_extra_collectives

# comm.csv's per-run counts (the report's communication table); its step-time columns get a table of their own.
COUNT_COLUMNS = [
    "group_label", "reduction", "loss_all_reduce_calls", "loss_all_reduce_bytes", "loss_all_reduce_latency_ms",
    "total_calls", "total_bytes", "total_comm_latency_ms", "extra_loss_calls_vs_local",
]  # fmt: skip
TIME_COLUMNS = ["group_label", "reduction", "step_ms_median", "peer_skew_ms_median", "step_time_vs_local_uncontrolled"]


def calls_clause(comm: pd.DataFrame) -> str:
    """How many more loss all-reduces per step `sum` and `detached` issue than `local` (exact counts)."""
    parts = []
    for mode in with_extra_collectives():
        calls = comm.loc[comm["reduction"] == mode, "extra_loss_calls_vs_local"].dropna()
        if len(calls):
            parts.append(
                f"`{mode}` issues {span(calls, '.0f')} more loss all-reduce{'' if calls.max() == 1 else 's'} per step than `local`"
                if (calls != 0).any()
                else f"`{mode}` as many loss all-reduces per step as `local`"
            )
    return "; ".join(parts)


def communication_answer(comm: pd.DataFrame) -> str:
    calls = calls_clause(comm)
    if calls:
        return calls + " (counted on the sampled steps)."
    if comm["loss_all_reduce_calls"].isna().all():
        return "Not counted: these runs recorded no collectives (metrics.count_comm=false, or no step logged)."
    return "As counted below; no completed `local` run here to compare each mode's loss all-reduces with."


def communication_section(comm: pd.DataFrame) -> list[str]:
    ordered = by_mode(comm)
    sections = [
        "## Communication per step",
        "",
        communication_answer(comm),
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
        f"{WARMUP_STEPS}); step_time_vs_local_uncontrolled divides one by the matching `local` run's. Those jobs "
        "ran minutes apart, so the ratio holds any change of the machine's load between them as much as the "
        "mode's cost, and nothing here controls for that: it has no CI, it is not a cost, and the report states "
        "none from it (the interleaved measurement does).",
        "",
        table(ordered[TIME_COLUMNS]),
        "",
    ]
