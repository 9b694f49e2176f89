"""How close two runs must be to count as the same: the loss curves, the gradient's direction and its scale."""

from __future__ import annotations

from dataclasses import dataclass


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
