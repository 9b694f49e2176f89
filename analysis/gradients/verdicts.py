"""One verdict per run from its measures (`measures.py`): reference, identical, equivalent, rescaled, different,
failed, not run or no reference, with the numbers behind it."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd

from analysis.gradients.tolerances import Tolerances
from analysis.load.sweeps import NOT_RUN


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
    hook = m["hook_norm_ratio_median"] if "hook_norm_ratio_median" in m else pd.Series(np.nan, index=m.index)
    off = hook.notna() & ((hook - 1).abs() > tol.scale_rtol)
    if off.any():
        out.loc[off, "verdict_text"] += (
            " (its logged grad norm ×" + hook[off].map(factor_label) + " the gradient's: the rule's grad_norm hook)"
        )
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
