"""A run's mode, as the analysis names and judges it, from its config (the rules are `runner.modes`').

`label_modes` turns the `reduction` column into the mode's label
(`runner.modes.run_mode_label`, the runner's own: `sum`, `sum[identity]`, a custom
rule by its `custom.name` with FSDP's reduction, `torchtitan [FSDP sum]`, or
`custom:MODULE:CALLABLE [FSDP mean]` where it has no name) and adds `gradient`
(against grad L: `runner.modes.run_gradient`), `fsdp_reduction` (the mode's, or
`custom.fsdp_reduce`) and `all_reduce`: the one sentence that says which
differentiable all-reduce the run used and what its backward does (empty for
modes without one in the graph). Two runs of one custom rule whose code differed get two labels.
"""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from runner.modes import (
    ALL_REDUCE_SENTENCE,
    AutogradAllReduce,
    Reduction,
    fsdp_reduction_of,
    has_graph_all_reduce,
    run_gradient,
    run_mode_label,
)


def _given(value: object) -> str | None:
    """A config value as recorded, None where the run's config lacks it (a missing column, or NaN)."""
    return value if isinstance(value, str) and value else None


def _mode_facts(reduction: object, all_reduce: object, fn: object, fsdp_reduce: object, name: object) -> tuple:
    """(label, gradient, FSDP reduction, all-reduce sentence) of one run; an unreadable mode keeps its value."""
    try:
        mode = Reduction(reduction)
    except ValueError:
        return reduction, None, None, ""
    implementation = AutogradAllReduce(_given(all_reduce) or "funcol")
    fsdp = fsdp_reduction_of(mode, _given(fsdp_reduce) or "mean")
    sentence = ALL_REDUCE_SENTENCE[implementation] if has_graph_all_reduce(mode) else ""
    # The runner's own label of the config (a record without custom.fsdp_reduce or custom.name reads as before).
    config = SimpleNamespace(
        reduction=mode,
        autograd_all_reduce=implementation,
        custom=SimpleNamespace(fn=_given(fn), name=_given(name), fsdp_reduce=_given(fsdp_reduce)),
    )
    return run_mode_label(config), run_gradient(mode, implementation), fsdp, sentence


LABEL_KEYS = ("reduction", "autograd_all_reduce", "custom.fn", "custom.fsdp_reduce", "custom.name")


def label_modes(runs: pd.DataFrame) -> pd.DataFrame:
    """`reduction` as the mode's label; `gradient`, `fsdp_reduction` and `all_reduce` beside it (see above).

    Runs recorded before `autograd_all_reduce` and `custom` existed read as funcol and not custom.
    """
    missing = pd.Series(None, index=runs.index, dtype=object)
    columns = [runs.get(c, missing) for c in LABEL_KEYS]
    facts = [_mode_facts(*values) for values in zip(*columns)]
    runs = runs.copy()
    for name, values in zip(
        ["reduction", "gradient", "fsdp_reduction", "all_reduce"], zip(*facts) if facts else [()] * 4
    ):
        runs[name] = list(values)
    return _apart_by_code(runs)


def _apart_by_code(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs of one custom rule's label whose code differed (the identity's `custom.fn` part: a sha256 over the
    rule's files) are told apart: each label then ends in its code's first 7 hex digits, `name (code 1a2b3c4)`,
    so that no line, colour or verdict merges two pieces of code under one name."""
    if "identity_custom_fn" not in runs:
        return runs
    code = runs["identity_custom_fn"]
    versions = code.groupby(runs["reduction"]).transform(lambda hashes: hashes.dropna().nunique())
    apart = code.notna() & versions.gt(1)
    runs.loc[apart, "reduction"] = runs.loc[apart, "reduction"] + " (code " + code[apart].str[:7] + ")"
    return runs
