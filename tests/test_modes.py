"""The modes' facts (`runner.modes`) hold for the code that runs them, and the analysis reads them.

The collectives are counted by the dispatch-level counter in a real two-rank
gloo world; the FSDP reduction and gradient factor are checked against the
single-process reference in tests/test_gradients.py.
"""

from __future__ import annotations

import pytest
import torch
from gloo_world import run_in_world
from helpers import run_config

from analysis.plots.curves import COLORS
from runner.layout import ParallelLayout
from runner.model.parallel import build_meshes
from runner.modes import BUILT_IN, FACTS, MODES, OVER_W, TRUE, Reduction, facts, modes_where, with_extra_collectives
from runner.train.components import build_parts
from runner.train.counter import CollectiveCounter
from runner.train.reduction import forward_backward

GRAD_ACCUM = 3


def counted_loss_all_reduces() -> dict[str, int]:
    """Per mode: the all-reduces of one step's forward/backward, counted by the dispatch-level counter."""
    counts = {}
    for mode in BUILT_IN:
        cfg = run_config(reduction=mode.value, grad_accum=GRAD_ACCUM, train__global_batch=12, train__seq_len=32)
        parts = build_parts(cfg, build_meshes(ParallelLayout(2, 1, GRAD_ACCUM), "cpu"), torch.device("cpu"))
        counter = CollectiveCounter()
        with counter:
            forward_backward(parts.model, parts.local_share(parts.batches(1)), parts.reducer(mode), parts.device)
        counts[mode.value] = counter.take().get("all_reduce", {}).get("calls", 0)
    return counts


def test_each_modes_loss_collectives_are_the_ones_it_issues():
    counted = run_in_world(counted_loss_all_reduces, 2)[0]
    for mode in BUILT_IN:
        kinds = facts(mode).loss_collectives(GRAD_ACCUM)
        # A differentiable all-reduce is two: forward, and backward of its gradient.
        assert counted[mode.value] == kinds["plain"] + kinds["functional"] + 2 * kinds["differentiable"], mode


def test_every_mode_has_facts_and_the_analysis_takes_its_order_and_colours_from_them():
    assert set(FACTS) == set(Reduction) and MODES == [m.value for m in Reduction]
    assert list(COLORS) == MODES and len(set(COLORS.values())) == len(MODES)
    assert modes_where(null_control=True) == ["fsdp_sum", "scaled"]
    assert all(facts(m).gradient == TRUE and facts(m).loss_collectives(4) == facts("local").loss_collectives(4)
               for m in modes_where(null_control=True))  # fmt: skip
    assert modes_where(gradient=OVER_W) == ["local", "detached"]
    assert with_extra_collectives() == ["sum", "detached"]


@pytest.mark.parametrize("mode", MODES)
def test_gradient_factor(mode):
    factor = facts(mode).gradient_factor(4)
    assert factor == {"grad L": 1.0, "grad L / W": 0.25}.get(facts(mode).gradient)
