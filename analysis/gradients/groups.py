"""Which runs are compared with which.

- A run's mode: its `reduction`, with the all-reduce of `sum` and the callable
  of `custom` (the config keys `runner.modes.MODE_KEYS`). `assign_groups`
  turns the `reduction` column into the mode's label (`runner.modes.mode_label`:
  `sum`, `sum[identity]`, `custom:MODULE:CALLABLE`), which every table and
  plot names, and adds the run's `gradient` against grad L
  (`runner.modes.run_gradient`), its `fsdp_reduction` and the one sentence
  about its differentiable all-reduce (`all_reduce`, where it has one).
- A comparison group: runs whose configs are identical except the mode's keys
  (and keys that cannot change the trajectory, `runner.trajectory.OUTSIDE_TRAJECTORY`). Its
  reference is its `sum` run: the one with funcol's SUM-backward all-reduce,
  the implementation checked against the single-process reference.
- A family: runs identical except the reduction and the parallel layout
  (`world_size`, `sp`, `grad_accum`, `dp_replicate`, `tp`, `pp`, and how the step is computed there:
  `pp_schedule`, `pp_microbatches`, `loss_parallel`). The global batch of every step is the
  same for all of them (it is drawn from the seed and the step alone), so a completed `world_size=1`
  `sum` run of the family (the smallest grad_accum) is the ground truth for
  every layout: where one exists it is every run's baseline, else the group's
  `sum` run is.

`train.steps` is outside both keys: runs of different lengths compare over
the steps they share (the learning-rate schedule does not depend on it).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.load.mode_labels import label_modes
from analysis.load.sweeps import RUN_COLUMNS
from runner.layout import ParallelLayout
from runner.modes import MODE_KEYS
from runner.trajectory import outside_trajectory

LAYOUT = ["world_size", "sp", "grad_accum", "dp_replicate", "tp", "pp"]
# How a layout computes the step, not what its gradient should be: runs that differ in these alone are one
# family (one world_size=1 ground truth), in groups of their own. None is read at the world_size=1 run's
# tp = pp = 1, whose config keeps the defaults.
HOW_COMPUTED = ["pp_schedule", "pp_microbatches", "loss_parallel"]


def data_ranks(rows: pd.DataFrame) -> pd.Series:
    """W of each row's factors: its data ranks (world_size / (tp x pp), `assign_groups`), or its world size in a table
    that predates them."""
    return rows["data_ranks"] if "data_ranks" in rows else rows["world_size"]


def config_columns(runs: pd.DataFrame) -> list[str]:
    """The config keys of `runs` that can change a trajectory (`runner.trajectory`)."""
    return [c for c in runs.columns if c not in RUN_COLUMNS and not outside_trajectory(c)]


def _key(runs: pd.DataFrame, columns: list[str]) -> pd.Series:
    """A readable id per distinct value combination of `columns` (g1, g2, ... in order of appearance)."""
    if not columns:
        return pd.Series("g1", index=runs.index)
    codes = runs[columns].astype(str).groupby(columns, sort=False, dropna=False).ngroup()
    return codes.map(lambda code: f"g{code + 1}")


def assign_groups(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` with `group`, `family`, `layout`, `optimizer`, `group_label`, `baseline` (a run id or NaN)
    and `baseline_kind`; `reduction` holds the mode's label (`analysis.load.mode_labels`)."""
    runs = runs.copy()
    config = [c for c in config_columns(runs) if not c.startswith(MODE_KEYS)]
    # What tells groups apart besides the layout: the other swept values (`optim.name=sgd`).
    swept = [c for c in varying_columns(runs) if not c.startswith(MODE_KEYS) and c not in LAYOUT]
    runs["group"] = _key(runs, config)
    runs["family"] = _key(runs, [c for c in config if c not in LAYOUT + HOW_COMPUTED]).str.replace("g", "f", n=1)
    runs["layout"] = _layout_names(runs)
    # W of the modes' factors: the ranks the loss is reduced over (`runner.layout.ParallelLayout.data_ranks`);
    # the tp ranks of a tensor-parallel group hold the same tokens, and so do the pp stages of a pipeline.
    runs["data_ranks"] = runs["world_size"] / (runs["tp"] * runs["pp"])
    runs["optimizer"] = [
        f"{name} (lr {lr:g}, clip {clip:g})" if isinstance(name, str) else "unknown optimizer"
        for name, lr, clip in zip(runs["optim.name"], runs["optim.lr"], runs["optim.clip"])
    ]
    runs["group_label"] = runs["layout"]
    for column in _label_columns(runs, swept):
        runs["group_label"] += " " + column + "=" + runs[column].map(_shown)
    runs = label_modes(runs)
    runs["baseline"], runs["baseline_kind"] = _baselines(runs)
    return runs


def _shown(value) -> str:
    """A config value as a label shows it; `unset` where a run's config lacks the key (e.g. a Hugging Face
    model's `model.overrides.*` in a run of the own decoder)."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "unset"
    return str(value)


def _label_columns(runs: pd.DataFrame, swept: list[str]) -> list[str]:
    """The swept columns a label names: those not already told by the ones before them (`model.name=hf_llama`
    tells `model.arch` and the preset's `model.overrides.*`)."""
    kept: list[str] = []
    for column in swept:
        values = runs[column].map(_shown)
        if kept and values.groupby([runs[c].map(_shown) for c in kept]).nunique().max() <= 1:
            continue
        kept.append(column)
    return kept


def _layout_names(runs: pd.DataFrame) -> np.ndarray:
    """The layout's name per run, as the runner prints it (`runner.layout.ParallelLayout`: DP(2)-SP(1)-GA(2),
    DP(2x2)-SP(1)-GA(2) for 2 replicas of 2 shards, DP(2)-SP(1)-TP(2)-GA(1), DP(2)-SP(1)-PP(2)-GA(2)); "unknown
    layout" where its config could not be read."""
    known = runs[LAYOUT].notna().all(axis=1)
    sizes = runs[LAYOUT].where(known, 1).astype(int)
    names = [
        str(ParallelLayout(world_size=w, sp=sp, grad_accum=m, dp_replicate=r, tp=t, pp=p))
        for w, sp, m, r, t, p in sizes[LAYOUT].itertuples(index=False)
    ]
    return np.where(known, names, "unknown layout")


def _baselines(runs: pd.DataFrame) -> tuple[pd.Series, np.ndarray]:
    """Each run's baseline: its family's world_size=1 `sum` run (smallest grad_accum), else its group's `sum`;
    a run whose model has dropout, always its group's `sum` (the same layout, so the same masks)."""
    completed_sum = runs[(runs["status"] == "completed") & (runs["reduction"] == "sum")]
    group_reference = completed_sum.drop_duplicates("group").set_index("group")["run"]
    ground_truth = (
        completed_sum[completed_sum["world_size"] == 1]
        .sort_values(["grad_accum", "sp"])
        .drop_duplicates("family")
        .set_index("family")["run"]
    )
    # With dropout, a layout draws its own masks (runner.train.rng): such a run compares with its own layout's sum.
    random_draws = runs["dropout"].notna() if "dropout" in runs else pd.Series(False, index=runs.index)
    from_family = runs["family"].map(ground_truth).astype(object).where(~random_draws)
    baseline = from_family.where(from_family.notna(), runs["group"].map(group_reference).astype(object))
    kind = np.where(
        from_family.notna(),
        "world_size=1 sum",
        np.where(
            baseline.notna(),
            np.where(random_draws, "group sum (dropout: layouts draw their own masks)", "group sum"),
            "none",
        ),
    )
    return baseline, kind


def varying_columns(runs: pd.DataFrame) -> list[str]:
    """Config columns that take more than one value across the runs (what a sweep swept)."""
    config = config_columns(runs)
    return [c for c in config if runs[c].astype(str).nunique() > 1]


class NotComparable(ValueError):
    """Runs that the analysis would compare trained on different data: it refuses, naming them."""


IDENTITY_PARTS = {"data": "identity_data", "tokenizer": "identity_tokenizer"}  # what a run trained on


def different_data(runs: pd.DataFrame) -> list[str]:
    """One sentence per family (the runs compared with one another) whose runs' identities record different data
    or tokenizer files (`runner.sweep.identity`), naming the runs on each side; runs without an identity (an
    earlier runner's) are not judged."""
    if "identity_digest" not in runs:
        return []
    recorded = runs[runs["identity_digest"].notna()]
    problems = []
    for _, family in recorded.groupby("family", sort=False):
        for part, column in IDENTITY_PARTS.items():
            values = family[column].fillna("none (byte-level)" if part == "tokenizer" else "none")
            if values.nunique() < 2:
                continue
            sides = [
                f"{', '.join(members['run'].head(3))}" + (f" (+{len(members) - 3} more)" if len(members) > 3 else "")
                + f" ({part} {str(value)[:12]})"
                for value, members in family.groupby(values, sort=False)
            ]  # fmt: skip
            problems.append(f"runs of one config trained on different {part} files: " + " vs ".join(sides))
    return problems


def refuse_different_data(runs: pd.DataFrame) -> None:
    """Raise NotComparable (every problem, and what to do) where `different_data` finds any."""
    problems = different_data(runs)
    if problems:
        raise NotComparable(
            "refused to compare: "
            + "; ".join(problems)
            + ". Analyse each data set's runs apart (one sweep directory at a time), or rerun them on the same data."
        )
