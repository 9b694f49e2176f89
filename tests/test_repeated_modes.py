"""Any two runs that can share a comparison group go through the whole analysis, plots included: every pair of
built-in modes, the same mode twice among them (runs of different lengths, `train.steps=3,4`, or a sweep beside a
single run of its `sum`, share a group: the length does not change the trajectory)."""

from __future__ import annotations

import itertools

import pytest

from analysis.pipeline import analyze
from analysis.testing.synthetic import SyntheticRun, write_sweep
from runner.modes import MODES

# As the modes' facts have them at W=2: local and detached give grad L / W, mean_of_means another direction.
SHAPE = {"local": {"factor": 0.5}, "detached": {"factor": 0.5}, "mean_of_means": {"turn": 0.3}}
PAIRS = list(itertools.combinations_with_replacement([m for m in MODES if m != "custom"], 2))


@pytest.mark.parametrize("first,second", PAIRS, ids=[f"{a}+{b}" for a, b in PAIRS])
def test_two_runs_in_one_group_are_analysed(tmp_path, first, second):
    runs = [
        SyntheticRun("sum", steps=6),
        SyntheticRun(first, steps=5, **SHAPE.get(first, {})),
        SyntheticRun(second, steps=4, **SHAPE.get(second, {})),
    ]
    sweep = write_sweep(tmp_path / "sweep", runs)
    result = analyze([sweep], sweep / "analysis", wandb_mode="disabled")
    verdicts = result.verdicts
    assert len(verdicts) == 3 and verdicts["group"].nunique() == 1  # one group, every run judged in it
    assert verdicts["as_expected"].eq(True).all(), verdicts[["reduction", "verdict_text", "expected"]]
    drawn = ["loss_curves.png", "gradient_scale.png"] + (["comm_overhead.png"] if {first, second} != {"sum"} else [])
    for name in drawn:  # the counted calls are drawn for two modes or more
        assert (sweep / "analysis" / name).stat().st_size > 0
