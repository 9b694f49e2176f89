"""What each mode costs in collectives, and the step times of the training runs (comm.csv).

Per run, per optimizer step (means over the steps whose collectives were counted):
- loss_*: the all-reduces of forward/backward (`loss_comm` in metrics.jsonl),
  i.e. the valid-token count N and the mode's own loss collectives;
- total_*: every collective the counter saw (FSDP's all-gathers and
  reduce-scatters, Ulysses' all-to-alls, the grad-norm all-reduce, the loss's);
- *_latency_ms: the counter's issue-to-completion latency, which includes
  waiting for the slowest peer to arrive: not the collective's own cost
  (that is the floor, `runner.measure.floor`); peer_skew_ms_median is that wait's
  measure at the step's first collective;
- own_loss_all_reduce_calls: the loss all-reduces beyond the two the runner issues for every run (the
  valid-token count N and the logged loss, `local`'s), from the modes' facts: what the mode or a trainer's
  rule issues itself (Megatron's: none but its num_tokens all-reduce);
- extra_loss_calls_vs_local: the loss all-reduces a step issues beyond the
  matching `local` runs' (exact: counted);
- extra_other_calls_vs_local: the step's other collectives (all but the loss
  all-reduces) beyond those `local` runs': a custom rule's own, such as the
  Hugging Face Trainer's all-gather of the token count, which is not a loss
  all-reduce;
- step_ms_median (the world's step time), and `step_time_vs_local_uncontrolled`:
  step_ms_median over that of the `local` runs paired with it.

That ratio compares jobs that ran one after another, minutes apart: a change in
the machine's load between them is in it as much as the mode, and nothing here
can tell the two apart (a CI over a job's steps would not cover it), so it has
no CI and its name says so. The cost the report states, with its CI, comes from
the interleaved measurement (`interleaved.py`) alone. A run is paired with the
completed `local` runs of its group that match it on everything that changes
the cost (the collective counter's settings too); repeats of that `local` are
averaged.

The first WARMUP_STEPS steps (allocator and thread-pool warm-up) are left out
of the step-time statistics.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from analysis import nanstats
from analysis.load.arrays import step_arrays
from runner.modes import Reduction, facts

WARMUP_STEPS = 5

# Each run's own columns, as `analysis.gradients.groups.assign_groups` gives them: its group, mode and layout.
ID_COLUMNS = [
    "group",
    "group_label",
    "reduction",
    "layout",
    "world_size",
    "sp",
    "grad_accum",
    "tp",
    "pp",
    "pp_schedule",
    "status",
]
COLUMNS = [
    *ID_COLUMNS,
    "loss_all_reduce_calls",
    "own_loss_all_reduce_calls",
    "loss_all_reduce_bytes",
    "loss_all_reduce_latency_ms",
    "total_calls",
    "total_bytes",
    "total_comm_latency_ms",
    "extra_loss_calls_vs_local",
    "extra_other_calls_vs_local",
    "step_ms_median",
    "peer_skew_ms_median",
    "step_time_vs_local_uncontrolled",
]
# Config keys outside the comparison group (runner.trajectory) that still change a run's step time: counting
# and gathering, checkpoints written, W&B logging.
COST_KEYS = (
    "metrics.count_comm",
    "metrics.count_first",
    "metrics.count_every",
    "metrics.gather_every",
    "train.checkpoint_every",
    "wandb.mode",
    "wandb.log_every",
)


def _averaging(codes: np.ndarray, n_keys: int, member: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([key, run] weights averaging each key's member runs, whether each run's key has a member)."""
    weights = np.zeros((n_keys, len(codes)))
    weights[codes[member], np.flatnonzero(member)] = 1.0
    count = weights.sum(axis=1)
    return weights / np.maximum(count, 1)[:, None], count[codes] > 0


def comm_table(runs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    fields = {
        "loss_all_reduce_calls": "loss_comm_calls",
        "loss_all_reduce_bytes": "loss_comm_bytes",
        "loss_all_reduce_latency_ms": "loss_comm_seconds",
        "total_calls": "comm_total_calls",
        "total_bytes": "comm_total_bytes",
        "total_comm_latency_ms": "comm_total_seconds",
    }
    logged, a = step_arrays(steps, runs["run"], [*fields.values(), "step_time_s", "peer_skew_s"])
    out = runs[ID_COLUMNS].copy()
    with warnings.catch_warnings():  # runs without a field (or without steps) give NaN, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        for column, source in fields.items():
            values = (
                np.nanmean(np.where(logged, a[source], np.nan), axis=1) if logged.any() else np.full(len(runs), np.nan)
            )
            out[column] = values * (1e3 if column.endswith("_ms") else 1)

    # The mode's or rule's own, beside what the runner issues for every run (`local`'s: the step's valid-token
    # count and the logged loss, one all-reduce each), so that a trainer's row says what the trainer issues.
    runner_calls = np.array(
        [
            sum(facts(Reduction.local).loss_collectives(int(m)).values()) if pd.notna(m) else np.nan
            for m in runs["grad_accum"]
        ],
        dtype=float,
    )  # NaN for a job whose config did not read
    out["own_loss_all_reduce_calls"] = out["loss_all_reduce_calls"] - runner_calls

    times = a["step_time_s"].copy()
    times[:, :WARMUP_STEPS] = np.nan
    times[~logged] = np.nan
    enough = np.isfinite(times).sum(axis=1) >= 2
    out["step_ms_median"] = np.where(enough, nanstats.nanmedian(np.where(enough[:, None], times, 0)) * 1e3, np.nan)
    skew = np.where(logged, a["peer_skew_s"], np.nan)
    skew[:, :WARMUP_STEPS] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out["peer_skew_ms_median"] = nanstats.nanmedian(skew) * 1e3 if skew.size else np.nan

    # Each run against the completed `local` runs that match it on everything that changes the cost.
    key = runs["group"].astype(str)
    for column in COST_KEYS:
        if column in runs:
            key = key + "|" + runs[column].astype(str)
    codes, keys = pd.factorize(key)
    completed_local = ((runs["reduction"] == "local") & (runs["status"] == "completed")).to_numpy()
    call_members, call_partner = _averaging(codes, len(keys), completed_local)
    time_members, has_partner = _averaging(codes, len(keys), completed_local & enough)
    calls = out["loss_all_reduce_calls"].to_numpy(dtype=float)
    other = out["total_calls"].to_numpy(dtype=float) - calls
    for column, counts in (("extra_loss_calls_vs_local", calls), ("extra_other_calls_vs_local", other)):
        counted = np.isfinite(counts)
        with np.errstate(invalid="ignore", divide="ignore"):
            local = (call_members @ np.where(counted, counts, 0.0)) / (call_members @ counted.astype(float))
        out[column] = np.where(call_partner, counts - local[codes], np.nan)
    medians = out["step_ms_median"].to_numpy(dtype=float)
    local_median = time_members @ np.nan_to_num(medians)  # the mean over each key's local runs (repeats averaged)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = medians / local_median[codes]
    out["step_time_vs_local_uncontrolled"] = np.where(has_partner & enough, ratio, np.nan)
    return out[COLUMNS].reset_index(drop=True)
