"""Each run against its baseline: the measures, then a verdict from them.

Every per-step quantity becomes a [run, step] array (a [run, step, k] one for
the gradient sketch), so each measure is one vectorised expression over all
runs at once. Row i of every array is run i of `runs`; `base` holds the row of
its baseline (-1: none).

Measures (r: the run, b: its baseline, t: a step both logged):
- loss_step1_(rel_)diff L_r(1) - L_b(1) (/ |L_b(1)|); at step 1 both start from the same init and batch
- grad_norm_ratio_*    |g_r| / |g_b| at step 1, and its median over t
- sketch_cos_*         <s_r, s_b> / (|s_r| |s_b|) of the gradient sketches: direction
- sketch_scale_*       <s_r, s_b> / |s_b|^2: the least-squares k in s_r ~ k s_b
- loss_max/mean_abs_diff, final_loss_diff (at the last shared step)
- first_step_beyond    first t with |L_r - L_b| > loss_rtol |L_b| (or L_r no longer finite)
- clip_active_frac     share of the run's steps where clipping scaled the gradient

The sketch is K fixed random projections of the whole gradient, identical for
every run, so a gradient k * g has sketch k * s exactly and cos = 1, scale = k;
a change of direction shows as cos < 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd

from analysis import nanstats

NOT_RUN = ("invalid", "skipped")  # statuses of jobs that never started a rank


@dataclass(frozen=True)
class Tolerances:
    # Runs of the same math in different layouts sum in different orders: float32
    # rounding that AdamW carries forward. On the `grid` experiment (60 AdamW
    # steps) equivalent layouts stay within 3e-6 relative, while `local` at W=2
    # (clipping active) departs by 2e-2: 1e-3 leaves room for longer runs.
    loss_rtol: float = 1e-3
    # 1 - cosine of the step-1 sketches up to which the direction is the same
    # (equivalent layouts: < 1e-14; mean_of_means with padded documents: 7e-4 to 0.13).
    cos_tol: float = 1e-6
    # |k - 1| up to which the step-1 gradient scale is unchanged (equivalent layouts: < 1e-7).
    scale_rtol: float = 1e-4


def _positions(steps: pd.DataFrame, run_ids: pd.Series) -> tuple[np.ndarray, np.ndarray, int]:
    """(which steps rows belong to `run_ids`, their flat index run * n_steps + step - 1, n_steps)."""
    n_steps = int(steps["step"].max()) if len(steps) else 1  # one unlogged column when no run logged a step
    row = pd.Categorical(steps["run"], categories=run_ids).codes
    keep = row >= 0
    return keep, row[keep].astype(np.int64) * n_steps + steps["step"].to_numpy()[keep].astype(int) - 1, n_steps


def step_arrays(
    steps: pd.DataFrame, run_ids: pd.Series, columns: list[str]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(logged[run, step], {column: values[run, step]}) with NaN where a run has no such step."""
    keep, flat, n_steps = _positions(steps, run_ids)
    logged = np.zeros((len(run_ids), n_steps), dtype=bool)
    logged.ravel()[flat] = True
    arrays = {}
    for column in columns:
        values = np.full((len(run_ids), n_steps), np.nan)
        if column in steps:
            values.ravel()[flat] = _kept(pd.to_numeric(steps[column], errors="coerce").to_numpy(dtype=float), keep)
        arrays[column] = values
    return logged, arrays


def step_stack(steps: pd.DataFrame, run_ids: pd.Series, columns: list[str]) -> np.ndarray:
    """values[run, step, k] of the float `columns` (the sketch), NaN where a run has no such step."""
    keep, flat, n_steps = _positions(steps, run_ids)
    values = np.full((len(run_ids), n_steps, len(columns)), np.nan)
    values.reshape(-1, len(columns))[flat] = _kept(steps[columns].to_numpy(dtype=float), keep)
    return values


def _kept(values: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """values[keep], without the copy where every row is kept (the usual case: a copy of a million steps
    is fresh memory, whose first touch costs more than the copying)."""
    return values if keep.all() else values[keep]


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
    logged, a = step_arrays(steps, runs["run"], ["loss", "grad_norm", "clip_coef"])
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
    clipped = logged & (a["clip_coef"] < 1.0)
    out["clip_active_frac"] = np.where(
        logged.any(axis=1), clipped.sum(axis=1) / np.maximum(logged.sum(axis=1), 1), np.nan
    )
    return out, curves


def factor_label(k: float) -> str:
    """k as a simple fraction (1/2, 1/4, 3/4, 2) when it is one to 1e-5, else to 6 digits."""
    if not np.isfinite(k):
        return ""
    fraction = Fraction(k).limit_denominator(64)
    simple = fraction.numerator <= 4 or fraction.denominator == 1
    if simple and fraction != 0 and abs(float(fraction) - k) <= 1e-5 * abs(k):
        return str(fraction)
    return f"{k:.6g}"


def verdicts(runs: pd.DataFrame, measures: pd.DataFrame, tol: Tolerances) -> pd.DataFrame:
    """One verdict per run: reference, identical, equivalent, rescaled, different, failed, not run or no reference."""
    m = measures
    is_baseline = runs["run"] == runs["baseline"]
    base_status = runs["baseline"].map(runs.set_index("run")["status"])
    # The scale: from the sketch when there is one, else from the grad norm (direction unmeasured).
    k = m["sketch_scale_step1"].fillna(m["grad_norm_ratio_step1"])
    same_direction = (1 - m["sketch_cos_step1"]).abs() <= tol.cos_tol
    direction_known = m["sketch_cos_step1"].notna()
    same_scale = (k - 1).abs() <= tol.scale_rtol
    loss_matches = m["first_step_beyond"].isna() & (m["steps_compared"] > 0)
    step1_loss_same = m["loss_step1_rel_diff"].abs() <= tol.loss_rtol

    out = pd.DataFrame(index=runs.index)
    out["loss_matches"] = loss_matches
    out["factor"] = k
    out["factor_label"] = k.map(factor_label)
    # The first rule that holds decides: (rule, verdict, condition).
    rules = [
        ("baseline", "reference", is_baseline),
        ("not run", "not run", runs["status"].isin(NOT_RUN)),
        ("failed", "failed", runs["status"] != "completed"),
        ("no baseline", "no reference", runs["baseline"].isna() | (base_status != "completed")),
        ("nothing shared", "no reference", m["steps_compared"] == 0),
        ("other start", "different", ~step1_loss_same),
        ("bitwise", "identical", m["losses_identical"] & m["sketch_identical"] & (m["grad_norm_ratio_step1"] == 1)),
        ("turned", "different", direction_known & ~same_direction),
        ("same", "equivalent", same_scale & loss_matches),
        ("same start, departs", "different", same_scale),
        ("scaled", "rescaled", ~same_scale),
    ]
    names, choices, conditions = zip(*rules)
    out["verdict"] = np.select(conditions, choices, default="different")
    rule = np.select(conditions, names, default="scaled")
    table = pd.concat([runs[["status", "diverged_at", "error"]], m, out], axis=1)
    out["reason"] = [_reason(r, row) for r, row in zip(rule, table.itertuples())]
    out["verdict_text"] = np.where(out["verdict"] == "rescaled", "rescaled ×" + out["factor_label"], out["verdict"])
    return out


def _steps(value: float) -> str:
    return "" if pd.isna(value) else str(int(value))


def _reason(rule: str, row) -> str:
    """The numbers behind the verdict `rule` gave (the rules of `verdicts`)."""
    deviates = f"loss curves deviate from step {_steps(row.first_step_beyond)}"
    if rule == "baseline":
        return "the baseline of its group"
    if rule == "not run":
        return f"job {row.status}" + (f": {row.error}" if row.error else "")
    if rule == "failed":
        where = f" at step {_steps(row.diverged_at)}" if pd.notna(row.diverged_at) else ""
        return f"run {row.status}{where}" + (f": {row.error}" if row.error else "")
    if rule == "no baseline":
        return "no completed baseline (sum run) for its group: sweep reduction=sum beside it (-m reduction=sum,...)"
    if rule == "nothing shared":
        return "no step logged by both runs"
    if rule == "other start":
        return f"step-1 loss differs by {row.loss_step1_rel_diff:.2e} relative: not the same model or data"
    if rule == "bitwise":
        return "bit-identical losses, grad norms and sketches"
    if rule == "turned":
        return f"gradient direction differs: step-1 sketch cosine {row.sketch_cos_step1:.6f}"
    if rule == "same":
        return f"same step-1 gradient (×{row.factor:.6f}); loss curves match"
    if rule == "same start, departs":
        return f"same step-1 gradient (×{row.factor:.6f}), but {deviates}"
    unmeasured = "" if pd.notna(row.sketch_cos_step1) else "; direction not measured (no grad_sketch)"
    still = "loss curves still match" if row.loss_matches else deviates
    return f"gradient ×{row.factor_label} (×{row.factor:.6f}); {still}{unmeasured}"
