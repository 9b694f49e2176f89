"""Ulysses attention on 2 and 4 gloo ranks equals single-rank causal attention, forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gloo_world import run_in_world

from runner.model.decoder import causal_attention
from runner.model.ulysses import UlyssesAttention

BATCH, HEADS, SEQ, HEAD_DIM = 2, 4, 16, 8


def ulysses_against_single_rank(sp: int) -> dict:
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(0)
    q, k, v, weight = (torch.randn(BATCH, HEADS, SEQ, HEAD_DIM, generator=generator) for _ in range(4))
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
    for rank, result in enumerate(run_in_world(ulysses_against_single_rank, sp, sp)):
        for name, (got, want) in result.items():
            torch.testing.assert_close(got, want, msg=lambda m: f"rank {rank} {name}: {m}")
