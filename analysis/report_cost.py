"""The report's sentences and table for the interleaved cost measurement (`analysis.cost`'s table)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.cost import NULL_MODES
from runner.modes import with_extra_collectives


def interleaved_clause(job: pd.DataFrame) -> str:
    """The cost of one interleaved measurement, stated only where its null control resolves it."""
    first = job.iloc[0]
    layout = f"DP({int(first['world_size'] // first['sp'])})-SP({int(first['sp'])})-GA({int(first['grad_accum'])})"
    head = (
        f"measured interleaved in one {layout} world ({int(first['steps'])} paired steps after warm-up, "
        f"median ratio to `local`'s forward+backward with a 95% block-bootstrap CI)"
    )
    null = job[job["role"] == "null control"]
    nulls = ", ".join(
        f"`{r['mode']}` {r['ratio']:.3f}× [{r['ci_low']:.3f}, {r['ci_high']:.3f}]" for _, r in null.iterrows()
    )
    if null.empty:
        return head + ": no null control (`fsdp_sum`, `scaled`) was measured, so no cost is stated"
    if (job["verdict"] == "null control failed").any():
        return (
            head + f": the null control failed ({nulls}: the same work as `local`, yet a CI that excludes 1), "
            "so this machine's noise is not under control and no mode's cost is stated; rerun on a quieter machine"
        )
    parts = [
        head
        + f": the null control passes ({nulls}), so differences beyond ±{first['resolution'] * 100:.1f}% are resolved"
    ]
    for _, row in job[job["role"] == "mode"].iterrows():
        mode = row["mode"]
        explains = {
            "yes": ", within the measured extra time's CI",
            "no: more than the collectives": ", below the measured extra time's CI: the collectives do not explain all of it",
            "no: less than the floor": ", above the measured extra time's CI",
        }
        floor = (
            f"; the floor predicts {row['predicted_extra_ms']:+.2f} ms ({row['extra_calls']})"
            + explains.get(row["floor_explains"], "")
            if np.isfinite(row["predicted_extra_ms"])
            else ""
        )
        if row["verdict"] == "resolved":
            parts.append(
                f"`{mode}` takes {row['extra_ms']:+.2f} ms per step ({row['ratio']:.3f}×, 95% CI [{row['ci_low']:.3f}, {row['ci_high']:.3f}])"
                + floor
            )
        elif mode in with_extra_collectives():
            parts.append(
                f"`{mode}`'s overhead is not resolvable on this machine ({row['ratio']:.3f}×, CI [{row['ci_low']:.3f}, "
                f"{row['ci_high']:.3f}] within the null control's reach)" + floor
            )
    return "; ".join(parts)


def table(frame: pd.DataFrame) -> str:
    return frame.to_markdown(index=False, floatfmt=".4g", missingval="")


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
        "verdict": "verdict",
        "predicted_extra_ms": "floor predicts ms",
        "floor_explains": "floor explains",
        "block": "block",
    }
    return cost[list(columns)].rename(columns=columns)


def cost_section(cost: pd.DataFrame | None, floor: pd.DataFrame | None, sweeps: list[Path]) -> list[str]:
    """report.md's cost section: the interleaved measurement's table, method and floor; one line without one."""
    if cost is None or cost.empty:
        target = f"{sweeps[0]}/cost" if sweeps else "SWEEP_DIR/cost"
        return [
            "## Cost, measured interleaved",
            "",
            "This analysis holds no interleaved cost job. `python -m runner experiment=cost "
            f"hydra.run.dir={target}` measures one beside these runs (`make run` does), and a rerun of the "
            "analysis reports it.",
            "",
        ]
    nulls = " and ".join(f"`{m}`" for m in NULL_MODES)
    sections = [
        "## Cost, measured interleaved",
        "",
        table(cost_rows(cost)),
        "",
        "Each step ran every mode on the same micro-batches and model state, in a random order, each after a "
        "barrier; a mode's time is the slowest rank's forward+backward. ratio: median over steps of its time "
        "over `local`'s on the same step; extra: median paired difference; 95% CIs from a moving-block "
        f"bootstrap (blocks of `block` steps). {nulls} do `local`'s work: their CIs must hold 1, "
        "and how far they reach from it is what the measurement can resolve.",
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
