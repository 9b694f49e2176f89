"""The parallel layout's messages suggest only values that pass every rule."""

from __future__ import annotations

import pytest

from runner.layout import ParallelLayout


@pytest.mark.parametrize(
    "world_size, sp, n_heads, seq_len, suggestion",
    [
        (8, 3, 4, 128, "valid sp: 1, 2, 4"),  # 8 divides the world but not the 4 heads
        (12, 5, 6, 128, "valid sp: 1, 2"),  # 3, 6 split the heads, not the 128 positions; 4, 12 not the heads
        (6, 4, 6, 126, "valid sp: 1, 2, 3, 6"),
    ],
)
def test_sp_suggestions_pass_every_sp_rule(world_size, sp, n_heads, seq_len, suggestion):
    (problem,) = ParallelLayout(world_size, sp, 1).problems(
        global_batch=world_size * 4, seq_len=seq_len, n_heads=n_heads
    )
    assert problem[0] == "sp" and problem[1].endswith(suggestion)
    for value in suggestion.split(": ")[1].split(", "):
        assert (
            ParallelLayout(world_size, int(value), 1).problems(
                global_batch=world_size * 4, seq_len=seq_len, n_heads=n_heads
            )
            == []
        )
