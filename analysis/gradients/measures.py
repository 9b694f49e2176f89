"""Each run against its baseline: the measures (the verdict from them: `verdicts.py`).

Every per-step quantity becomes a [run, step] array (a [run, step, k] one for
the gradient sketch; `analysis.load.arrays`), so each measure is one vectorised
expression over all runs at once. Row i of every array is run i of `runs`;
`base` holds the row of its baseline (-1: none).

Measures (r: the run, b: its baseline, t: a step both logged):
- loss_step1_(rel_)diff L_r(1) - L_b(1) (/ |L_b(1)|); at step 1 both start from the same init and batch
- grad_norm_ratio_*    |g_r| / |g_b| at step 1, and its median over t
- sketch_cos_*         <s_r, s_b> / (|s_r| |s_b|) of the gradient sketches: direction
- sketch_scale_*       <s_r, s_b> / |s_b|^2: the least-squares k in s_r ~ k s_b
- loss_max/mean_abs_diff, final_loss_diff (at the last shared step)
- first_step_beyond    first t with |L_r - L_b| > loss_rtol |L_b| (or L_r no longer finite)
- clip_active_frac     share of the run's steps where clipping scaled the gradient
- reported_loss_ratio_step1/_median  the run's reported loss (what its mode or rule logs) over its own L
                       (the global token-mean loss the runner computes beside every mode): 1 where it logs L,
                       1/W where it logs the ranks' mean of a local loss (xtuner's engine without the CE
                       all-reduce)

The sketch is K fixed random projections of the whole gradient, identical for
every run, so a gradient k * g has sketch k * s exactly and cos = 1, scale = k;
a change of direction shows as cos < 1.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis import nanstats
from analysis.gradients.tolerances import Tolerances
from analysis.load.arrays import step_arrays, step_stack


def departs(loss: np.ndarray, base_loss: np.ndarray, shared: np.ndarray, tol: Tolerances) -> np.ndarray:
    """[run, step]: where a curve has left its baseline: |L - L_b| > loss_rtol |L_b|, or L no longer finite."""
    with np.errstate(invalid="ignore"):
        too_far = np.abs(loss - base_loss) > tol.loss_rtol * np.abs(base_loss)
    return shared & np.isfinite(base_loss) & (~np.isfinite(loss) | too_far)


def first_true(mask: np.ndarray) -> np.ndarray:
    """1-based index of the first True per row; NaN where there is none."""
    first = mask.argmax(axis=1).astype(float) + 1
    first[~mask.any(axis=1)] = np.nan
    return first


def _nan_median(values: np.ndarray) -> np.ndarray:
    out = np.full(values.shape[0], np.nan)
    has = np.isfinite(values).any(axis=1)
    out[has] = nanstats.nanmedian(values[has])
    return out


def measure(runs: pd.DataFrame, steps: pd.DataFrame, tol: Tolerances) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """Per-run measures against the baseline, and the per-step curves behind them (for plots)."""
    sketch_columns = sorted((c for c in steps.columns if c.startswith("sketch_")), key=lambda c: int(c.split("_")[1]))
    logged, a = step_arrays(steps, runs["run"], ["loss", "grad_norm", "clip_coef", "reported_loss", "true_grad_norm"])
    position = pd.Series(np.arange(len(runs)), index=runs["run"].to_numpy())
    base = runs["baseline"].map(position).fillna(-1).astype(int).to_numpy()
    has_base = base >= 0
    b = np.where(has_base, base, 0)

    loss, base_loss = a["loss"], a["loss"][b]
    shared = logged & logged[b] & has_base[:, None]
    both_finite = shared & np.isfinite(loss) & np.isfinite(base_loss)
    abs_diff = np.where(both_finite, np.abs(loss - base_loss), np.nan)
    beyond = departs(loss, base_loss, shared, tol)
    last_shared = np.where(both_finite.any(axis=1), both_finite.shape[1] - 1 - both_finite[:, ::-1].argmax(axis=1), 0)
    rows = np.arange(len(runs))

    grad_ratio = np.where(shared, a["grad_norm"] / a["grad_norm"][b], np.nan)
    out = pd.DataFrame(index=runs.index)
    out["steps_compared"] = shared.sum(axis=1)
    out["loss_step1_diff"] = np.where(shared[:, 0], loss[:, 0] - base_loss[:, 0], np.nan)
    out["loss_step1_rel_diff"] = out["loss_step1_diff"] / np.abs(base_loss[:, 0])
    out["grad_norm_ratio_step1"] = grad_ratio[:, 0]
    out["grad_norm_ratio_median"] = _nan_median(grad_ratio)
    # A rule's grad_norm hook against the gradient's own norm (true_grad_norm, recorded where a hook ran).
    with np.errstate(invalid="ignore", divide="ignore"):
        out["hook_norm_ratio_median"] = _nan_median(np.where(logged, a["grad_norm"] / a["true_grad_norm"], np.nan))

    curves = {
        "logged": logged,
        "loss": loss,
        "loss_diff": np.where(shared, loss - base_loss, np.nan),
        "grad_norm_ratio": grad_ratio,
    }
    if sketch_columns:
        sketch = step_stack(steps, runs["run"], sketch_columns)  # [run, step, k]
        base_sketch = sketch[b]
        identical = (sketch == base_sketch).all(-1)
        # The products go into base_sketch's memory, no longer needed: at 1,000 runs every [run, step, k]
        # array is 64 MB of fresh pages, whose first touch costs more than the arithmetic.
        dot = np.multiply(sketch, base_sketch, out=base_sketch).sum(-1)
        # |s|^2 per run and step, once: the baseline's is a row of it (np.linalg.norm is the root of this sum).
        squared = np.square(sketch, out=base_sketch).sum(-1)
        norm = np.sqrt(squared)
        with np.errstate(invalid="ignore", divide="ignore"):  # a zero or missing sketch gives NaN, not a warning
            cos = dot / (norm * norm[b])
            scale = dot / squared[b]
        cos, scale = np.where(shared, cos, np.nan), np.where(shared, scale, np.nan)
        out["sketch_cos_step1"], out["sketch_scale_step1"] = cos[:, 0], scale[:, 0]
        out["sketch_cos_min"] = np.where(
            np.isfinite(cos).any(axis=1), np.nanmin(np.where(np.isfinite(cos), cos, np.inf), axis=1), np.nan
        )
        out["sketch_scale_median"] = _nan_median(scale)
        out["sketch_identical"] = shared.any(axis=1) & (identical | ~shared).all(axis=1)
        curves.update(sketch_cos=cos, sketch_scale=scale)
    else:
        for column in ("sketch_cos_step1", "sketch_scale_step1", "sketch_cos_min", "sketch_scale_median"):
            out[column] = np.nan
        out["sketch_identical"] = False
    has_diff = np.isfinite(abs_diff).any(axis=1)
    out["loss_max_abs_diff"] = np.where(has_diff, np.nanmax(np.where(has_diff[:, None], abs_diff, 0), axis=1), np.nan)
    out["loss_mean_abs_diff"] = np.where(has_diff, np.nanmean(np.where(has_diff[:, None], abs_diff, 0), axis=1), np.nan)
    out["final_loss_diff"] = np.where(has_diff, loss[rows, last_shared] - base_loss[rows, last_shared], np.nan)
    out["first_step_beyond"] = first_true(beyond)
    out["losses_identical"] = shared.any(axis=1) & ((loss == base_loss) | ~shared).all(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        reported = np.where(logged, a["reported_loss"] / loss, np.nan)
    reported[~np.isfinite(reported)] = np.nan
    out["reported_loss_ratio_step1"] = reported[:, 0]
    out["reported_loss_ratio_median"] = _nan_median(reported)
    clipped = logged & (a["clip_coef"] < 1.0)
    out["clip_active_frac"] = np.where(
        logged.any(axis=1), clipped.sum(axis=1) / np.maximum(logged.sum(axis=1), 1), np.nan
    )
    return out, curves
