"""Each mode's cost from the interleaved measurement (`runner.measure.cost`): paired, exact, null-controlled.

A cost job logs, per step t, every arm's world time T[t, mode] (the slowest
rank's forward/backward, each arm after a barrier, in an order drawn at random
each step). Per mode, against `local` on the same step (the same
micro-batches, model state and machine load):

    d_t = T[t, mode] - T[t, local]            the extra time
    r_t = log(T[t, mode] / T[t, local])        the ratio, on a log scale

Because each step's order is random, the sign of d_t is a fair coin under "the
mode costs what local costs", whatever the load's correlation over time: the
signed-rank test is exact, and the Hodges-Lehmann shift with the confidence
interval that inverts it (`randomization.py`) says how much. `ratio` and
`extra_ms` are those shifts of r_t (exponentiated) and d_t; `p_value` the
test's, `p_holm` after Holm's correction over every arm of the job, so that on
an unchanged machine the chance of any false verdict stays under 5 %.

The null control: arms that do `local`'s work (`fsdp_sum`, `scaled`) must not
be told apart from it. When every null arm holds (Holm p > 0.05), a mode is
`resolved` when its Holm p <= 0.05, and its cost is stated with its CI;
otherwise it is `not resolved` and its CI's upper end is stated as a bound ("at
most +X ms"). When a null arm fails, the machine's noise is not under control
and no cost is stated. Beside each mode: the floor's prediction, sum over kinds
of (its loss all-reduces - local's) x the floor's median per call
(floor.json), and whether the extra time's CI holds it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.cost.randomization import holm, signed_rank_shift
from runner.modes import modes_where

BASELINE = "local"
NULL_MODES = tuple(modes_where(null_control=True))  # fsdp_sum, scaled: local's collectives, grad L
CONFIDENCE = 0.95
LEVEL = 0.05  # family-wise, over the arms of one cost job (Holm)
MIN_STEPS = 6  # below this the signed-rank test cannot reach the level at all

COLUMNS = [
    "job", "world_size", "sp", "grad_accum", "dp_replicate", "tp", "pp", "mode", "role", "steps", "local_ms", "ratio", "ci_low", "ci_high",
    "extra_ms", "extra_ci_low", "extra_ci_high", "p_value", "p_holm", "verdict", "predicted_extra_ms",
    "floor_explains", "extra_calls",
]  # fmt: skip


def read_cost_job(job: Path) -> tuple[pd.DataFrame, dict, dict | None]:
    """(T[step, mode] in seconds, loss collectives per mode, floor or None) of one cost job."""
    records = []
    for line in (job / "metrics.jsonl").read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a last line cut short: keep the whole ones
            break
    times = pd.DataFrame([r["cost_s"] for r in records], index=[r["step"] for r in records])
    collectives = next((r["loss_collectives"] for r in records if r.get("loss_collectives")), {})
    floor_file = job / "floor.json"
    floor = json.loads(floor_file.read_text()) if floor_file.exists() else None
    return times, collectives, floor


def paired_shifts(times: pd.DataFrame, warmup_steps: int, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """Per arm other than local: the Hodges-Lehmann ratio and extra ms against local on the same steps,
    with CIs that invert the exact signed-rank test, and its p-value (steps after `warmup_steps`)."""
    steady = times[times.index > warmup_steps].dropna()
    if BASELINE not in steady or len(steady) < MIN_STEPS:
        return pd.DataFrame(columns=["mode", "steps"])
    base = steady[BASELINE].to_numpy()
    rows = []
    for mode in (m for m in steady.columns if m != BASELINE):
        arm = steady[mode].to_numpy()
        ratio = signed_rank_shift(np.log(arm / base), confidence)
        extra = signed_rank_shift(arm - base, confidence)
        rows.append(
            {
                "mode": mode,
                "steps": len(steady),
                "local_ms": np.median(base) * 1e3,
                "ratio": np.exp(ratio.estimate),
                "ci_low": np.exp(ratio.low),
                "ci_high": np.exp(ratio.high),
                "extra_ms": extra.estimate * 1e3,
                "extra_ci_low": extra.low * 1e3,
                "extra_ci_high": extra.high * 1e3,
                "p_value": ratio.p_value,
            }
        )
    return pd.DataFrame(rows)


def _predictions(modes: pd.Series, collectives: dict, floor: dict | None) -> tuple[np.ndarray, list]:
    """(predicted extra ms, extra calls by kind) per mode from the floor and the modes' loss collectives."""
    base = collectives.get(BASELINE, {})
    predicted, calls = [], []
    for mode in modes:
        extra = {kind: n - base.get(kind, 0) for kind, n in collectives.get(mode, {}).items()}
        calls.append(", ".join(f"{n:+d} {kind}" for kind, n in extra.items() if n) or "none")
        if floor is None or not extra:
            predicted.append(np.nan)
        else:
            predicted.append(sum(n * floor[kind]["median_s"] for kind, n in extra.items()) * 1e3)
    return np.array(predicted), calls


def judge(table: pd.DataFrame, level: float = LEVEL) -> pd.DataFrame:
    """Role, Holm-corrected p-value and verdict per arm of one cost job (see the module docstring)."""
    table = table.copy()
    table["role"] = np.where(table["mode"].isin(NULL_MODES), "null control", "mode")
    table["p_holm"] = holm(table["p_value"].to_numpy())
    null = table["role"] == "null control"
    null_holds = table["p_holm"] > level
    if not null.any():
        modes = np.full(len(table), "no null control")
    elif not null_holds[null].all():
        modes = np.full(len(table), "null control failed")
    else:
        modes = np.where(null_holds, "not resolved", "resolved")
    table["verdict"] = np.where(null, np.where(null_holds, "null: holds", "null: differs"), modes)
    predicted = table["predicted_extra_ms"]
    holds = (table["extra_ci_low"] <= predicted) & (predicted <= table["extra_ci_high"])
    table["floor_explains"] = np.select(
        [predicted.isna(), holds, table["extra_ci_low"] > predicted],
        ["no floor", "yes", "no: more than the collectives"],
        default="no: less than the floor",
    )
    return table


def cost_table(cost_jobs: pd.DataFrame, confidence: float = CONFIDENCE, level: float = LEVEL) -> pd.DataFrame:
    """cost.csv: one row per (cost job, mode other than local). `cost_jobs` holds `path` and config columns."""
    tables = []
    for _, job in cost_jobs.iterrows():
        times, collectives, floor = read_cost_job(Path(job["path"]))
        table = paired_shifts(times, int(job.get("cost.warmup_steps", 5)), confidence=confidence)
        if table.empty:
            continue
        table["predicted_extra_ms"], table["extra_calls"] = _predictions(table["mode"], collectives, floor)
        table = judge(table, level)
        for column in ("job", "world_size", "sp", "grad_accum"):
            table[column] = job[column]
        for key in ("dp_replicate", "tp", "pp"):
            table[key] = job.get(key, 1)  # absent from configs written before the key
        tables.append(table)
    if not tables:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(tables, ignore_index=True)[COLUMNS]


def short_cost_jobs(cost_jobs: pd.DataFrame) -> list[str]:
    """A note for each cost job with too few steps after its warm-up to compare (`MIN_STEPS`), naming how many
    it has and the train.steps that would give enough."""
    notes = []
    for _, job in cost_jobs.iterrows():
        times, _, _ = read_cost_job(Path(job["path"]))
        warmup = int(job.get("cost.warmup_steps", 5))
        steady = len(times[times.index > warmup].dropna())
        if 0 < len(times) and steady < MIN_STEPS:
            notes.append(
                f"the cost job in {job['path']} holds {steady} steps after its warm-up of {warmup} "
                f"(cost.warmup_steps), and comparing the modes needs {MIN_STEPS}: rerun it with "
                f"train.steps={warmup + MIN_STEPS} or more"
            )
    return notes


def floor_table(cost_jobs: pd.DataFrame) -> pd.DataFrame:
    """The floor of each cost job: per kind, median and p90 ms per call."""
    rows = []
    for _, job in cost_jobs.iterrows():
        path = Path(job["path"]) / "floor.json"
        if not path.exists():
            continue
        floor = json.loads(path.read_text())
        for kind in ("plain", "functional", "differentiable"):
            rows.append(
                {
                    "job": job["job"],
                    "backend": floor["backend"],
                    "world_size": floor["world_size"],
                    "kind": kind,
                    "median_ms": floor[kind]["median_s"] * 1e3,
                    "p90_ms": floor[kind]["p90_s"] * 1e3,
                    "calls": floor[kind]["calls"],
                }
            )
    return pd.DataFrame(rows, columns=["job", "backend", "world_size", "kind", "median_ms", "p90_ms", "calls"])
