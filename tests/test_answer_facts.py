"""The answer's sentence about the correct alternatives says of each what the modes' facts say it issues: a
mode with a collective per micro-batch is never said to have none."""

from __future__ import annotations

import dataclasses

from analysis.pipeline import analyze
from analysis.testing.synthetic import SyntheticRun, write_sweep
from runner import modes
from runner.modes import Reduction

RUNS = [
    SyntheticRun("sum"),
    SyntheticRun("local", factor=0.5),
    SyntheticRun("fsdp_sum"),
    SyntheticRun("scaled"),
]


def answer(tmp_path) -> str:
    result = analyze([write_sweep(tmp_path / "sweep", RUNS)], tmp_path / "out", make_plots=False, wandb_mode="disabled")
    return result.answer


def test_the_alternatives_with_locals_collectives_are_said_to_have_none_per_micro_batch(tmp_path):
    assert "`fsdp_sum` and `scaled` recover the true gradient exactly with `local`'s collectives (none per " in (
        answer(tmp_path)
    )


def test_an_alternative_with_a_collective_per_micro_batch_is_not(tmp_path, monkeypatch):
    # scaled as if it all-reduced every micro-batch (a new mode's facts, as docs/extending.md adds one)
    heavier = dataclasses.replace(modes.FACTS[Reduction.scaled], functional_per_micro_batch=True)
    monkeypatch.setitem(modes.FACTS, Reduction.scaled, heavier)
    said = answer(tmp_path)
    assert "`fsdp_sum` recovers the true gradient exactly with `local`'s collectives (none per micro-batch)." in said
    assert "`scaled` recovers it too." in said and "`scaled` recover the true gradient" not in said
