"""Moving-block bootstrap of paired per-step ratios: B1's harness measurement (bench/harness.py).

Steps are correlated (load drifts over seconds), so confidence intervals come
from resampling runs of `block` consecutive steps (block = n^(1/3), rounded),
not single steps. The interleaved cost measurement of the reduction modes uses
the exact randomisation inference of `randomization.py` instead.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

RESAMPLES = 2000
CONFIDENCE = 0.95


def moving_blocks(n: int, block: int, rng: np.random.Generator, resamples: int = RESAMPLES) -> np.ndarray:
    """[resample, n] step indices: ceil(n / block) runs of `block` consecutive steps, cut to n."""
    starts = rng.integers(0, n - block + 1, size=(resamples, -(-n // block)))
    return (starts[:, :, None] + np.arange(block)).reshape(resamples, -1)[:, :n]


def block_length(n: int) -> int:
    """The moving-block bootstrap's block for n correlated steps: n^(1/3), rounded."""
    return max(1, round(n ** (1 / 3)))


def paired_overheads(
    times: pd.DataFrame, warmup_steps: int, seed: int = 0, confidence: float = CONFIDENCE, baseline: str = "local"
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
