"""The report's "Cost, measured interleaved" section and sentences (`analysis.cost.interleaved`'s table)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.cost.interleaved import NULL_MODES
from analysis.report.markdown import listed, table
from runner.layout import ParallelLayout
from runner.modes import MODES, facts, with_extra_collectives

QUESTION = "Does a mode take more or less time a step than `local`?"


def _layout(first: pd.Series) -> str:
    """The cost job's layout by its name (`runner.layout.ParallelLayout`: DP(2x2)-SP(1)-GA(1) under HSDP,
    DP(2)-SP(1)-TP(2)-GA(2) under tensor parallelism, DP(2)-SP(1)-PP(2)-GA(2) under pipeline parallelism); a
    config without dp_replicate, tp or pp reads it as 1."""
    replicas, tp, pp = first.get("dp_replicate", 1), first.get("tp", 1), first.get("pp", 1)
    return str(
        ParallelLayout(
            int(first["world_size"]),
            int(first["sp"]),
            int(first["grad_accum"]),
            1 if pd.isna(replicas) else int(replicas),
            tp=1 if pd.isna(tp) else int(tp),
            pp=1 if pd.isna(pp) else int(pp),
        )
    )


def cost_answer(job: pd.DataFrame) -> str:
    """One cost job's answer in one sentence: does a mode take more time a step than `local`, and how much; or why
    no cost is stated (the numbers behind it: `interleaved_clause` and the section's table)."""
    first = job.iloc[0]
    where = f"at {_layout(first)} over {int(first['steps'])} paired steps"
    if not (job["role"] == "null control").any():
        return f"{QUESTION} Not stated {where}: no null control ({' or '.join(f'`{m}`' for m in NULL_MODES)}) was measured."
    if (job["verdict"] == "null control failed").any():
        return f"{QUESTION} Not stated {where}: the null control failed, so this machine's noise is not under control."
    modes = job[job["role"] == "mode"]
    if modes.empty:
        return f"{QUESTION} Not asked: only the null control was measured {where} (it holds)."
    resolved = modes[modes["verdict"] == "resolved"]
    bounded = modes[modes["verdict"] != "resolved"]
    # Every mode resolved: no bounds to state (`listed` of none has no words).
    bounds = (
        listed([f"`{row['mode']}` {row['extra_ci_high']:+.2f} ms" for _, row in bounded.iterrows()])
        if len(bounded)
        else ""
    )
    if resolved.empty:
        return f"{QUESTION} Not that this measurement can tell {where}: at most {bounds} a step."
    costs = listed(
        [
            f"`{row['mode']}` takes {abs(row['extra_ms']):.2f} ms ({abs(row['ratio'] - 1) * 100:.1f} %) a step "
            + ("more" if row["extra_ms"] > 0 else "less")
            for _, row in resolved.iterrows()
        ]
    )
    rest = f"; {bounds} at most (not resolved)" if len(bounded) else ""
    return f"{QUESTION} Yes, {costs} than `local` {where}{rest}."


def interleaved_clause(job: pd.DataFrame) -> str:
    """What one interleaved measurement says: each mode's cost with its CI where the exact test resolves it,
    else the most it can cost; nothing where the null control fails."""
    first = job.iloc[0]
    layout = _layout(first)
    arms = len(job) + 1
    head = (
        f"measured interleaved in one {layout} world ({int(first['steps'])} steps after warm-up, {arms} arms in a "
        f"random order each step; each mode against `local` on the same steps: the Hodges-Lehmann shift with the "
        f"95% CI of the exact signed-rank test, Holm-corrected over the {arms - 1} comparisons)"
    )
    null = job[job["role"] == "null control"]
    nulls = ", ".join(
        f"`{r['mode']}` {r['ratio']:.3f}× [{r['ci_low']:.3f}, {r['ci_high']:.3f}], Holm p = {r['p_holm']:.2g}"
        for _, r in null.iterrows()
    )
    if null.empty:
        return (
            head + f": no null control ({' or '.join(f'`{m}`' for m in NULL_MODES)}) was measured, so no cost is stated"
        )
    if (job["verdict"] == "null control failed").any():
        return (
            head + f": the null control failed ({nulls}: the same work as `local`, yet told apart from it), "
            "so this machine's noise is not under control and no mode's cost is stated; rerun on a quieter machine"
        )
    parts = [head + f": the null control holds ({nulls})"]
    for _, row in job[job["role"] == "mode"].iterrows():
        if row["verdict"] == "resolved" or row["mode"] in with_extra_collectives():
            parts.append(mode_cost(row, layout))
    return "; ".join(parts)


def mode_cost(row: pd.Series, layout: str) -> str:
    """One mode's cost: resolved, with its CI beside the floor's prediction; else the most it can be."""
    percent = (row["ratio"] - 1) * 100
    if row["verdict"] == "resolved":
        text = (
            f"`{row['mode']}` costs {row['extra_ms']:+.2f} ms a step ({percent:+.1f} %; 95% CI "
            f"[{row['extra_ci_low']:+.2f}, {row['extra_ci_high']:+.2f}] ms, Holm p = {row['p_holm']:.2g})"
        )
    else:
        most = (row["ci_high"] - 1) * 100
        text = (
            f"`{row['mode']}` costs at most {row['extra_ci_high']:+.2f} ms ({most:+.1f} %) a step at {layout} on "
            f"this machine (not resolved once corrected for the job's comparisons, Holm p = {row['p_holm']:.2g}: "
            f"{row['extra_ms']:+.2f} ms, 95% CI [{row['extra_ci_low']:+.2f}, {row['extra_ci_high']:+.2f}] on its own)"
        )
    return text + _floor_clause(row)


def _floor_clause(row: pd.Series) -> str:
    if not np.isfinite(row["predicted_extra_ms"]):
        return ""
    explains = {
        "yes": ", within the measured CI",
        "no: more than the collectives": ", under the measured CI: the collectives alone do not explain it"
        + _why_more(row["mode"]),
        "no: less than the floor": ", above the measured CI",
    }
    return f"; the floor predicts {row['predicted_extra_ms']:+.2f} ms ({row['extra_calls']})" + explains.get(
        row["floor_explains"], ""
    )


def _why_more(mode: str) -> str:
    """What makes a mode dearer than its collectives, where the modes' facts say (measured in B10)."""
    known = facts(mode) if mode in MODES else None
    if known is None or not (known.functional_per_micro_batch or known.differentiable_per_micro_batch):
        return ""
    return (
        " (each micro-batch waits for its all-reduce at once, a point where the ranks wait for each other; "
        "B10 measured that deferring detached's waits to the step's end removes its excess)"
    )


def cost_rows(cost: pd.DataFrame | None) -> pd.DataFrame:
    if cost is None or cost.empty:
        return pd.DataFrame()
    columns = {
        "mode": "mode",
        "role": "role",
        "local_ms": "local ms",
        "ratio": "ratio",
        "ci_low": "CI low",
        "ci_high": "CI high",
        "extra_ms": "extra ms",
        "extra_ci_low": "extra CI low",
        "extra_ci_high": "extra CI high",
        "p_holm": "Holm p",
        "verdict": "verdict",
        "predicted_extra_ms": "floor predicts ms",
        "floor_explains": "floor explains",
    }
    return cost[list(columns)].rename(columns=columns)


def cost_section(
    cost: pd.DataFrame | None, floor: pd.DataFrame | None, sweeps: list[Path], notes: list[str] | None = None
) -> list[str]:
    """report.md's cost section: the interleaved measurement's table, method and floor; one line without one,
    which says why where a cost job was refused, failed or left no record (`notes`, the load's)."""
    said = [note[0].upper() + note[1:] + "." for note in notes or [] if "cost job" in note]
    if cost is None or cost.empty:
        target = f"{sweeps[0]}/cost" if sweeps else "SWEEP_DIR/cost"
        why = " ".join(said) if said else "this analysis holds no interleaved cost job."
        return [
            "## Cost, measured interleaved",
            "",
            f"{QUESTION} Not measured: {why[0].lower() + why[1:]} `python -m runner experiment=cost "
            f"hydra.run.dir={target}` measures one beside these runs (`make run` does), and a rerun of the "
            "analysis reports it.",
            "",
        ]
    nulls = " and ".join(f"`{m}`" for m in NULL_MODES)
    sections = [
        "## Cost, measured interleaved",
        "",
        " ".join(cost_answer(job) for _, job in cost.groupby("job", sort=False)),
        "",
        *([" ".join(said), ""] if said else []),
        table(cost_rows(cost)),
        "",
        "Each step ran every mode on the same micro-batches and model state, in a random order, each after a "
        "barrier; a mode's time is the slowest rank's forward+backward. ratio and extra: against `local` on "
        "the same steps, the Hodges-Lehmann shifts of the paired log ratios and "
        "differences, with the 95% CIs that invert the exact signed-rank test (exact because each step's arm "
        "order is random: the load's correlation between steps cannot bias it); Holm p: the test's p-value "
        f"corrected over the job's comparisons. {nulls} do `local`'s work: they must not be told apart from it "
        "(Holm p > 0.05); a mode is resolved at Holm p <= 0.05, and otherwise its CI's upper end bounds its cost.",
        "",
    ]
    if floor is not None and len(floor):
        sections += [
            "Floor: a scalar all-reduce timed alone after a barrier (slowest rank, per call):",
            "",
            table(floor),
            "",
        ]
    return sections
