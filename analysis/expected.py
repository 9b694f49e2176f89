"""What each mode's verdict should be (DESIGN.md section 3), for `--check`.

- sum, fsdp_sum, scaled: the gradient of the global token-mean loss, so
  identical or equivalent to the baseline (sum is the reference of its group).
- local, detached: that gradient divided by W = world_size: rescaled by 1/W
  (equivalent at W=1). Whether their loss curves still match is a finding, not
  a requirement: it depends on the optimizer and clipping.
- mean_of_means: a differently weighted gradient whenever the valid-token
  counts of the W * grad_accum micro-batch shards vary, i.e. with padded
  documents (data.packing=false) and more than one shard; else equivalent.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.compare import NOT_RUN, Tolerances, factor_label

SAME = {"reference", "identical", "equivalent"}


def expected_verdicts(runs: pd.DataFrame, verdicts: pd.DataFrame, tol: Tolerances) -> pd.DataFrame:
    """`expected` (text) and `as_expected` (bool; NA for jobs that never ran) per run."""
    mode = runs["reduction"]
    shards = runs["world_size"] * runs["grad_accum"]
    varying_counts = ~runs["data.packing"].astype(bool) & (shards > 1)
    rescaled_expected = mode.isin(["local", "detached"]) & (runs["world_size"] > 1)
    different_expected = (mode == "mean_of_means") & varying_counts

    verdict = verdicts["verdict"]
    factor_ok = (verdicts["factor"] * runs["world_size"] - 1).abs() <= tol.scale_rtol
    as_expected = np.select(
        [rescaled_expected, different_expected],
        [(verdict == "rescaled") & factor_ok, verdict == "different"],
        default=verdict.isin(SAME),
    )
    out = pd.DataFrame(index=runs.index)
    out["expected"] = np.select(
        [rescaled_expected, different_expected],
        ["rescaled ×" + (1 / runs["world_size"]).map(factor_label), "different"],
        default="equivalent",
    )
    out["as_expected"] = pd.array(as_expected, dtype="boolean")
    out.loc[runs["status"].isin(NOT_RUN), "as_expected"] = pd.NA
    return out
