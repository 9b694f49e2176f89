"""Ulysses attention on 2 and 4 gloo ranks equals single-rank causal attention, forward and backward,
with as many key/value heads as query heads or fewer (grouped-query attention: moved as they are when
sp divides their count, repeated first when it does not)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gloo_world import run_in_world

from runner.model.decoder import causal_attention
from runner.model.ulysses import UlyssesAttention

BATCH, HEADS, SEQ, HEAD_DIM = 2, 4, 16, 8
KV_HEADS = (HEADS, 2, 1)  # at sp=2: moved as they are, as they are, repeated; at sp=4: as they are, repeated, repeated


def ulysses_against_single_rank(sp: int) -> dict:
    """Per key/value head count: (got, want) of the output and of q's, k's and v's gradients on this rank's chunk."""
    return {kv_heads: _against_single_rank(sp, kv_heads) for kv_heads in KV_HEADS}


def _against_single_rank(sp: int, kv_heads: int) -> dict:
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(0)
    q, weight = (torch.randn(BATCH, HEADS, SEQ, HEAD_DIM, generator=generator) for _ in range(2))
    k, v = (torch.randn(BATCH, kv_heads, SEQ, HEAD_DIM, generator=generator) for _ in range(2))
    chunk = slice(rank * SEQ // sp, (rank + 1) * SEQ // sp)

    full = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = causal_attention(*full)
    (reference * weight).sum().backward()

    local = [t[:, :, chunk].clone().requires_grad_() for t in (q, k, v)]
    out = UlyssesAttention(dist.group.WORLD)(*local)
    # Each rank's loss covers its own chunk; the sum over ranks is the reference loss.
    (out * weight[:, :, chunk]).sum().backward()
    return {
        "out": (out.detach(), reference.detach()[:, :, chunk]),
        **{name: (t.grad, f.grad[:, :, chunk]) for name, t, f in zip("qkv", local, full)},
    }


@pytest.mark.parametrize("sp", [2, 4])
def test_ulysses_matches_single_rank_attention(sp):
    for rank, results in enumerate(run_in_world(ulysses_against_single_rank, sp, sp)):
        for kv_heads, result in results.items():
            for name, (got, want) in result.items():
                torch.testing.assert_close(got, want, msg=lambda m: f"rank {rank} kv_heads={kv_heads} {name}: {m}")


@pytest.mark.parametrize(
    "sp, heads, kv_heads, repeats",
    [(2, 4, 4, 1), (2, 4, 2, 1), (2, 4, 1, 2), (4, 4, 2, 2), (4, 4, 1, 4), (4, 32, 8, 1), (8, 32, 4, 2), (4, 12, 3, 4)],
)
def test_key_value_heads_are_repeated_only_as_much_as_sp_needs(sp, heads, kv_heads, repeats):
    ulysses = UlyssesAttention.__new__(UlyssesAttention)  # no process group needed for the arithmetic
    ulysses.sp = sp
    assert ulysses.kv_repeats(heads, kv_heads) == repeats
