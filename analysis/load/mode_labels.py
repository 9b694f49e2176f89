"""A run's mode, as the analysis names and judges it, from its config (the rules are `runner.modes`').

`label_modes` turns the `reduction` column into the mode's label
(`runner.modes.mode_label`: `sum`, `sum[identity]`, `custom:MODULE:CALLABLE`)
and adds `gradient` (against grad L: `runner.modes.run_gradient`),
`fsdp_reduction` (the mode's, or `custom.fsdp_reduce`) and `all_reduce`: the one
sentence that says which differentiable all-reduce the run used and what its
backward does (empty for modes without one in the graph).
"""

from __future__ import annotations

import pandas as pd

from runner.modes import (
    ALL_REDUCE_SENTENCE,
    AutogradAllReduce,
    Reduction,
    fsdp_reduction_of,
    has_graph_all_reduce,
    mode_label,
    run_gradient,
)


def _mode_facts(reduction: object, all_reduce: object, fn: object, fsdp_reduce: object) -> tuple:
    """(label, gradient, FSDP reduction, all-reduce sentence) of one run; an unreadable mode keeps its value."""
    try:
        mode = Reduction(reduction)
    except ValueError:
        return reduction, None, None, ""
    implementation = AutogradAllReduce(all_reduce if isinstance(all_reduce, str) else "funcol")
    fsdp = fsdp_reduction_of(mode, fsdp_reduce if isinstance(fsdp_reduce, str) else "mean")
    sentence = ALL_REDUCE_SENTENCE[implementation] if has_graph_all_reduce(mode) else ""
    label = mode_label(mode, implementation, fn if isinstance(fn, str) else None)
    return label, run_gradient(mode, implementation), fsdp, sentence


def label_modes(runs: pd.DataFrame) -> pd.DataFrame:
    """`reduction` as the mode's label; `gradient`, `fsdp_reduction` and `all_reduce` beside it (see above).

    Runs recorded before `autograd_all_reduce` and `custom` existed read as funcol and not custom.
    """
    missing = pd.Series(None, index=runs.index, dtype=object)
    columns = [runs.get(c, missing) for c in ("reduction", "autograd_all_reduce", "custom.fn", "custom.fsdp_reduce")]
    facts = [_mode_facts(*values) for values in zip(*columns)]
    runs = runs.copy()
    for name, values in zip(
        ["reduction", "gradient", "fsdp_reduction", "all_reduce"], zip(*facts) if facts else [()] * 4
    ):
        runs[name] = list(values)
    return runs
