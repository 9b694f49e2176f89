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


@pytest.mark.parametrize("world_size", range(1, 13))
def test_dp_replicate_must_divide_dp_and_the_message_lists_every_valid_value(world_size):
    """Every (sp, R) with sp dividing W and 1 <= R <= W + 1: refused exactly when R does not divide dp = W / sp,
    naming the numbers; each value the message offers is accepted."""
    for sp in (d for d in range(1, world_size + 1) if world_size % d == 0):
        dp = world_size // sp
        for replicas in range(1, world_size + 2):
            layout = ParallelLayout(world_size, sp, 1, dp_replicate=replicas)
            found = dict(layout.problems(global_batch=dp * 4, seq_len=sp * 8, n_heads=None))
            assert ("dp_replicate" in found) == (dp % replicas != 0), (world_size, sp, replicas)
            if dp % replicas:
                message = found["dp_replicate"]
                assert f"dp_replicate={replicas} does not divide dp = world_size / sp = {world_size} / {sp} = {dp}" in (
                    message
                )
                offered = [int(v) for v in message.split("valid dp_replicate: ")[1].split(", ")]
                assert offered == [r for r in range(1, dp + 1) if dp % r == 0]
                for value in offered:
                    ok = ParallelLayout(world_size, sp, 1, dp_replicate=value)
                    assert ok.problems(global_batch=dp * 4, seq_len=sp * 8, n_heads=None) == []


def test_dp_replicate_below_one_is_refused():
    assert ParallelLayout(4, 1, 1, dp_replicate=0).problems(global_batch=8, seq_len=8, n_heads=None) == [
        ("dp_replicate", "dp_replicate=0 must be >= 1")
    ]


@pytest.mark.parametrize(
    "world_size, sp, grad_accum, replicas, name, shards",
    [
        (2, 1, 2, 1, "DP(2)-SP(1)-GA(2)", 2),  # one replica: the names of every earlier run, unchanged
        (4, 2, 1, 1, "DP(2)-SP(2)-GA(1)", 4),
        (4, 1, 2, 2, "DP(2x2)-SP(1)-GA(2)", 2),  # 2 replicas of 2 shards
        (4, 1, 1, 4, "DP(4x1)-SP(1)-GA(1)", 1),  # DDP: every dp rank a whole replica
        (8, 2, 2, 2, "DP(2x2)-SP(2)-GA(2)", 4),  # a replica's copy sharded over its 2 dp ranks x 2 sp ranks
    ],
)
def test_layout_names_show_replicas_by_shards(world_size, sp, grad_accum, replicas, name, shards):
    layout = ParallelLayout(world_size, sp, grad_accum, dp_replicate=replicas)
    assert str(layout) == name
    assert layout.fsdp_shards == shards and layout.dp_replicate * layout.fsdp_shards == world_size


def test_replicas_hold_bigger_shards_in_the_memory_estimate():
    """DDP (R = dp = 4) keeps the whole model, its gradients and AdamW's moments on every rank (16 P bytes),
    FSDP at W = 4 a quarter of them; the sketch's projections (8 K P / shards) likewise."""
    from runner.config import config_with
    from runner.sweep.memory import rank_memory

    def parts(replicas: int) -> list[tuple[float, str, list[str]]]:
        return rank_memory(config_with({"world_size": 4, "grad_accum": 1, "dp_replicate": replicas}))

    (fsdp_model, _, fsdp_fields), (fsdp_sketch, _, _) = parts(1)[:2]
    (ddp_model, _, ddp_fields), (ddp_sketch, _, _) = parts(4)[:2]
    params = ddp_sketch / (8 * 8)  # K = metrics.sketch_dim = 8 projections of the whole model, float64
    assert ddp_sketch == pytest.approx(4 * fsdp_sketch)
    assert ddp_model - fsdp_model == pytest.approx(16 * params - 16 * params / 4)
    assert "dp_replicate" in ddp_fields and "dp_replicate" not in fsdp_fields
