"""Each mode's cost from the interleaved measurement (`runner.measure.cost`): paired, block-bootstrapped, null-controlled.

A cost job logs, per step t, every arm's world time T[t, mode] (the slowest
rank's forward/backward, each arm after a barrier, in a random order per
step). Per mode, against `local` of the same step:

    r_t = T[t, mode] / T[t, local]        paired: the same step, model state and machine load
    ratio     = median_t r_t
    extra_ms  = median_t (T[t, mode] - T[t, local])

Steps are correlated (load drifts over seconds), so the 95% confidence
intervals come from a moving-block bootstrap: resample runs of `block`
consecutive steps (block = n^(1/3), rounded), not single steps.

The null control: `fsdp_sum` and `scaled` issue exactly `local`'s collectives,
so their ratio must be 1 and their CI must contain it. When it does, the null
arms' CIs say what this machine can resolve: `resolution` is the farthest a
null CI reaches from 1. A mode's overhead is stated only when the null control
passes and its CI lies outside 1 +- resolution; otherwise it is "not
resolvable on this machine". Beside each mode: the prediction from the floor,
sum over kinds of (its loss all-reduces - local's) x the floor's median per
call (floor.json), and whether the measured extra time's CI holds it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from runner.modes import modes_where

BASELINE = "local"
NULL_MODES = tuple(modes_where(null_control=True))  # fsdp_sum, scaled: local's collectives, grad L
RESAMPLES = 2000
CONFIDENCE = 0.95

COLUMNS = [
    "job",
    "world_size",
    "sp",
    "grad_accum",
    "mode",
    "role",
    "steps",
    "block",
    "local_ms",
    "ratio",
    "ci_low",
    "ci_high",
    "extra_ms",
    "extra_ci_low",
    "extra_ci_high",
    "resolution",
    "verdict",
    "predicted_extra_ms",
    "floor_explains",
    "extra_calls",
]


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


def moving_blocks(n: int, block: int, rng: np.random.Generator, resamples: int = RESAMPLES) -> np.ndarray:
    """[resample, n] step indices: ceil(n / block) runs of `block` consecutive steps, cut to n."""
    starts = rng.integers(0, n - block + 1, size=(resamples, -(-n // block)))
    return (starts[:, :, None] + np.arange(block)).reshape(resamples, -1)[:, :n]


def block_length(n: int) -> int:
    """The moving-block bootstrap's block for n correlated steps: n^(1/3), rounded."""
    return max(1, round(n ** (1 / 3)))


def paired_overheads(
    times: pd.DataFrame, warmup_steps: int, seed: int = 0, confidence: float = CONFIDENCE, baseline: str = BASELINE
) -> pd.DataFrame:
    """Per arm: ratio and extra ms against `baseline` with block-bootstrap CIs (steps after `warmup_steps`)."""
    steady = times[times.index > warmup_steps].dropna()
    n = len(steady)
    if baseline not in steady or n < 4:
        return pd.DataFrame(columns=["mode", "steps", "block"])
    block = block_length(n)
    base = steady[baseline].to_numpy()
    modes = [m for m in steady.columns if m != baseline]
    arms = steady[modes].to_numpy()  # [step, mode]
    ratios, extras = arms / base[:, None], arms - base[:, None]
    index = moving_blocks(n, block, np.random.default_rng(seed))
    boot_ratio = np.median(ratios[index], axis=1)  # [resample, mode]
    boot_extra = np.median(extras[index], axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(boot_ratio, [tail, 100 - tail], axis=0)
    extra_low, extra_high = np.percentile(boot_extra, [tail, 100 - tail], axis=0)
    return pd.DataFrame(
        {
            "mode": modes,
            "steps": n,
            "block": block,
            "local_ms": np.median(base) * 1e3,
            "ratio": np.median(ratios, axis=0),
            "ci_low": low,
            "ci_high": high,
            "extra_ms": np.median(extras, axis=0) * 1e3,
            "extra_ci_low": extra_low * 1e3,
            "extra_ci_high": extra_high * 1e3,
        }
    )


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


def judge(table: pd.DataFrame) -> pd.DataFrame:
    """Role, resolution and verdict per mode of one cost job (see the module docstring)."""
    table = table.copy()
    table["role"] = np.where(table["mode"].isin(NULL_MODES), "null control", "mode")
    null = table[table["role"] == "null control"]
    passes = len(null) > 0 and bool(((null["ci_low"] <= 1) & (null["ci_high"] >= 1)).all())
    resolution = float(np.maximum(1 - null["ci_low"], null["ci_high"] - 1).max()) if len(null) else np.nan
    table["resolution"] = resolution
    outside = (table["ci_low"] > 1 + resolution) | (table["ci_high"] < 1 - resolution)
    verdicts = np.where(outside, "resolved", "not resolvable on this machine")
    if not len(null):
        verdicts = np.full(len(table), "no null control")
    elif not passes:
        verdicts = np.full(len(table), "null control failed")
    null_verdict = np.where((table["ci_low"] <= 1) & (table["ci_high"] >= 1), "null: contains 1", "null: excludes 1")
    table["verdict"] = np.where(table["role"] == "null control", null_verdict, verdicts)
    holds = (table["extra_ci_low"] <= table["predicted_extra_ms"]) & (
        table["predicted_extra_ms"] <= table["extra_ci_high"]
    )
    above = table["extra_ci_low"] > table["predicted_extra_ms"]
    table["floor_explains"] = np.select(
        [table["predicted_extra_ms"].isna(), holds, above],
        ["no floor", "yes", "no: more than the collectives"],
        default="no: less than the floor",
    )
    return table


def cost_table(cost_jobs: pd.DataFrame, seed: int = 0, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """cost.csv: one row per (cost job, mode other than local). `cost_jobs` holds `path` and config columns."""
    tables = []
    for _, job in cost_jobs.iterrows():
        times, collectives, floor = read_cost_job(Path(job["path"]))
        table = paired_overheads(times, int(job.get("cost.warmup_steps", 5)), seed=seed, confidence=confidence)
        if table.empty:
            continue
        table["predicted_extra_ms"], table["extra_calls"] = _predictions(table["mode"], collectives, floor)
        table = judge(table)
        for column in ("job", "world_size", "sp", "grad_accum"):
            table[column] = job[column]
        tables.append(table)
    if not tables:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(tables, ignore_index=True)[COLUMNS]


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
