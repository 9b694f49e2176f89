"""What each mode costs in communication and step time (comm.csv).

Per run, per optimizer step (means over its logged steps):
- loss_*: the all-reduces of forward/backward (`loss_comm` in metrics.jsonl),
  i.e. the valid-token count N and the mode's own loss collectives;
- total_*: every collective the counter saw (FSDP's all-gathers and
  reduce-scatters, Ulysses' all-to-alls, the grad-norm all-reduce, the loss's);
- step_ms_median, and `overhead_vs_local`: mean step time over that of the
  `local` run of the same group, with a 95% bootstrap confidence interval.

The first WARMUP_STEPS steps (allocator and thread-pool warm-up) are left out
of the step-time statistics. The bootstrap is the Poisson one: each resample
weights every step by an independent Poisson(1) count, so all runs are
resampled at once as two matrix products, whatever their lengths.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from analysis.compare import step_arrays

WARMUP_STEPS = 5
RESAMPLES = 2000
CONFIDENCE = 0.95

COLUMNS = [
    "group", "group_label", "reduction", "layout", "world_size", "sp", "grad_accum", "status",
    "loss_all_reduce_calls", "loss_all_reduce_bytes", "loss_all_reduce_ms",
    "total_calls", "total_bytes", "total_comm_ms", "extra_loss_calls_vs_local",
    "step_ms_median", "overhead_vs_local", "overhead_ci_low", "overhead_ci_high",
]


def _bootstrap_means(times: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[resample, run] means of each row of `times` (NaN: no step) under Poisson(1) step weights."""
    present = np.isfinite(times)
    weights = rng.poisson(1.0, size=(RESAMPLES, times.shape[1])).astype(float)
    totals = weights @ np.where(present, times, 0.0).T
    counts = weights @ present.T.astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return totals / counts


def comm_table(runs: pd.DataFrame, steps: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    fields = {
        "loss_all_reduce_calls": "loss_comm_calls",
        "loss_all_reduce_bytes": "loss_comm_bytes",
        "loss_all_reduce_ms": "loss_comm_seconds",
        "total_calls": "comm_total_calls",
        "total_bytes": "comm_total_bytes",
        "total_comm_ms": "comm_total_seconds",
    }
    logged, a = step_arrays(steps, runs["run"], [*fields.values(), "step_time_s"])
    out = runs[["group", "group_label", "reduction", "layout", "world_size", "sp", "grad_accum", "status"]].copy()
    with warnings.catch_warnings():  # runs without a field (or without steps) give NaN, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        for column, source in fields.items():
            values = np.nanmean(np.where(logged, a[source], np.nan), axis=1) if logged.any() else np.full(len(runs), np.nan)
            out[column] = values * (1e3 if column.endswith("_ms") else 1)

    times = a["step_time_s"].copy()
    times[:, :WARMUP_STEPS] = np.nan
    times[~logged] = np.nan
    enough = np.isfinite(times).sum(axis=1) >= 2
    out["step_ms_median"] = np.where(enough, np.nanmedian(np.where(enough[:, None], times, 0), axis=1) * 1e3, np.nan)

    # Each run against the completed `local` run of its group.
    position = pd.Series(np.arange(len(runs)), index=runs.index)
    local = runs[(runs["reduction"] == "local") & (runs["status"] == "completed")].drop_duplicates("group")
    partner = runs["group"].map(pd.Series(position[local.index].to_numpy(), index=local["group"])).fillna(-1).astype(int)
    partner = partner.to_numpy()
    out["extra_loss_calls_vs_local"] = np.where(
        partner >= 0, out["loss_all_reduce_calls"] - out["loss_all_reduce_calls"].to_numpy()[partner], np.nan
    )
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(times, axis=1) if times.size else np.full(len(runs), np.nan)
        run_means, local_means = _bootstrap_means(times, rng), _bootstrap_means(times, rng)
        paired = (partner >= 0) & enough & enough[np.maximum(partner, 0)]
        p = np.maximum(partner, 0)
        ratios = run_means / local_means[:, p]
        tail = (1 - CONFIDENCE) / 2 * 100
        low, high = np.nanpercentile(ratios, [tail, 100 - tail], axis=0) if len(runs) else (np.array([]), np.array([]))
        out["overhead_vs_local"] = np.where(paired, mean / mean[p], np.nan)
    out["overhead_ci_low"] = np.where(paired, low, np.nan)
    out["overhead_ci_high"] = np.where(paired, high, np.nan)
    return out[COLUMNS].reset_index(drop=True)
