"""What each mode's verdict should be (from its gradient in `runner.modes`), for `--check`.

- sum, fsdp_sum, scaled: the gradient of the global token-mean loss, so
  identical or equivalent to the baseline (sum is the reference of its group).
- local, detached: that gradient divided by W, the ranks the loss is reduced
  over (world_size / (tp x pp)): rescaled by 1/W (equivalent at W=1). Whether their
  loss curves still match is a finding, not a requirement: it depends on the
  optimizer and clipping.
- mean_of_means: a differently weighted gradient whenever the valid-token
  counts of the dp * grad_accum micro-batches vary, else equivalent. Decided
  from the data: the runner logs each step's fewest and most valid tokens of a
  micro-batch (`micro_batch_tokens_min/max`). Counts that differ at step 1 make
  "different" the expectation; counts equal at every step make it
  "equivalent"; counts that differ only later allow either. Runs that predate
  those fields fall back to the config: padded documents (data.packing=false)
  and more than one micro-batch.
- sum with an identity-backward all-reduce (`sum[identity]`): grad L / W, as
  local (`runner.modes.run_gradient` gives each run's gradient from its mode
  and all-reduce; `analysis.load.mode_labels` puts it in `gradient`).
- custom: what `custom.expect` states (`runner.modes.custom_expectation`: a
  factor of grad L, or different), else "not judged": as_expected is NA and
  `--check` does not fail on it. The verdict itself is always the measured one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.gradients.tolerances import Tolerances
from analysis.gradients.verdicts import factor_label
from analysis.load.sweeps import NOT_RUN
from runner.modes import CUSTOM, OVER_W, REWEIGHTED, custom_expectation

SAME = {"reference", "identical", "equivalent"}


def token_counts_vary(runs: pd.DataFrame, steps: pd.DataFrame | None) -> tuple[pd.Series, pd.Series]:
    """(vary at step 1, vary at some step) per run, from the logged micro-batch token range (or the config)."""
    micro_batches = runs["data_ranks"] / runs["sp"].fillna(1) * runs["grad_accum"]
    from_config = ~runs["data.packing"].astype(bool) & (micro_batches > 1)
    at_first, anywhere = from_config.copy(), from_config.copy()
    if steps is not None and {"micro_batch_tokens_min", "micro_batch_tokens_max"} <= set(steps.columns):
        logged = steps.dropna(subset=["micro_batch_tokens_min", "micro_batch_tokens_max"])
        varies = logged["micro_batch_tokens_min"] != logged["micro_batch_tokens_max"]
        by_run = varies.groupby(logged["run"], observed=True)
        first = varies[logged["step"] == 1].groupby(logged.loc[logged["step"] == 1, "run"], observed=True).any()
        known = runs["run"].isin(by_run.any().index)
        at_first = at_first.where(~known, runs["run"].map(first).fillna(False).astype(bool))
        anywhere = anywhere.where(~known, runs["run"].map(by_run.any()).fillna(False).astype(bool))
    return at_first.astype(bool), anywhere.astype(bool)


def expected_verdicts(
    runs: pd.DataFrame, verdicts: pd.DataFrame, tol: Tolerances, steps: pd.DataFrame | None = None
) -> pd.DataFrame:
    """`expected` (text) and `as_expected` (bool; NA for jobs that never ran) per run."""
    gradient = runs["gradient"]  # the run's gradient against grad L, from its mode and all-reduce
    varies_at_first, varies_anywhere = token_counts_vary(runs, steps)
    reweighted = gradient == REWEIGHTED
    rescaled_expected = (gradient == OVER_W) & (runs["data_ranks"] > 1)
    different_expected = reweighted & varies_at_first
    either_expected = reweighted & ~varies_at_first & varies_anywhere

    verdict = verdicts["verdict"]
    factor_ok = (verdicts["factor"] * runs["data_ranks"] - 1).abs() <= tol.scale_rtol
    as_expected = np.select(
        [rescaled_expected, different_expected, either_expected],
        [(verdict == "rescaled") & factor_ok, verdict == "different", verdict.isin(SAME | {"different"})],
        default=verdict.isin(SAME),
    )
    out = pd.DataFrame(index=runs.index)
    out["expected"] = np.select(
        [rescaled_expected, different_expected, either_expected],
        ["rescaled ×" + (1 / runs["data_ranks"]).map(factor_label), "different", "equivalent or different"],
        default="equivalent",
    )
    out["as_expected"] = pd.array(as_expected, dtype="boolean")
    custom = gradient == CUSTOM
    if custom.any():
        judged = [
            _custom(*row, tol)
            for row in zip(
                runs.loc[custom, "custom.expect"],
                runs.loc[custom, "world_size"],
                verdicts.loc[custom, "verdict"],
                verdicts.loc[custom, "factor"],
            )
        ]
        out.loc[custom, "expected"] = [text for text, _ in judged]
        out.loc[custom, "as_expected"] = pd.array([ok for _, ok in judged], dtype="boolean")
    out.loc[runs["status"].isin(NOT_RUN), "as_expected"] = pd.NA
    return out


def _custom(expect: object, world_size: int, verdict: str, factor: float, tol: Tolerances) -> tuple[str, object]:
    """(expected, as_expected) of a custom run: as `custom.expect` states, or not judged (NA) without it.

    A run that failed is never as expected, stated or not."""
    try:
        stated = custom_expectation(expect, int(world_size)) if isinstance(expect, str) else None
    except ValueError:
        stated = None
    if stated is None:
        return "not judged (no custom.expect)", False if verdict == "failed" else pd.NA
    if stated == "different":
        return "different", verdict == "different"
    if abs(stated - 1) <= tol.scale_rtol:
        return "equivalent", verdict in SAME
    return f"rescaled ×{factor_label(stated)}", verdict == "rescaled" and abs(factor / stated - 1) <= tol.scale_rtol
