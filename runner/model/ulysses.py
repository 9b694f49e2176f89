"""Ulysses sequence parallelism: attention over the whole sequence for sequence-sharded activations.

Each of the sp ranks of a sequence holds a contiguous chunk of T/sp positions
for all H heads. Before attention, one all-to-all on the sp group trades
sequence for heads: every rank then holds the whole sequence for H/sp heads,
runs ordinary causal attention, and a second all-to-all trades back. Positions
are already rotated (RoPE) with each chunk's absolute offset, so attention
sees exactly what a single rank would. The all-to-alls are PyTorch's
autograd-aware functional collectives: their backward is the reverse all-to-all.

Grouped-query attention (k and v with H_kv < H heads, query head h reading
key/value head h // (H / H_kv)): head group j of the queries needs exactly
key/value head group j when S divides H_kv, so k and v travel with their own
H_kv heads (a second all-to-all, H / H_kv times smaller than repeating them).
When S does not divide H_kv, each key/value head is first repeated r times,
r the smallest divisor of H / H_kv that makes S divide r * H_kv (the grouping
is unchanged by it).

Shapes below: B batch, H heads, T sequence, D head dim, S = sp.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from runner.model.decoder import AttentionFn, causal_attention


class UlyssesAttention:
    def __init__(self, group: dist.ProcessGroup, attention: AttentionFn = causal_attention):
        self.group = group
        self.sp = dist.get_world_size(group)
        self.attention = attention

    def _all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        """Dim 0 (size S) is scattered to the S ranks; what arrives is stacked by source rank."""
        return funcol.all_to_all_single_autograd(x.contiguous(), None, None, self.group)

    def sequence_to_heads(self, qkv: torch.Tensor) -> torch.Tensor:
        """[n, B, H, T/S, D] -> [n, B, H/S, T, D] (n tensors stacked, e.g. q, k, v): head group j goes to sp rank j."""
        three, batch, heads, chunk, dim = qkv.shape
        by_head_group = qkv.view(three, batch, self.sp, heads // self.sp, chunk, dim).permute(2, 0, 1, 3, 4, 5)
        received = self._all_to_all(by_head_group)  # [S (sequence chunk), 3, B, H/S, T/S, D]
        return received.permute(1, 2, 3, 0, 4, 5).reshape(three, batch, heads // self.sp, self.sp * chunk, dim)

    def heads_to_sequence(self, out: torch.Tensor) -> torch.Tensor:
        """[B, H/S, T, D] -> [B, H, T/S, D]: sequence chunk i goes back to sp rank i."""
        batch, local_heads, seq, dim = out.shape
        by_chunk = out.view(batch, local_heads, self.sp, seq // self.sp, dim).permute(2, 0, 1, 3, 4)
        received = self._all_to_all(by_chunk)  # [S (head group), B, H/S, T/S, D]
        return received.permute(1, 0, 2, 3, 4).reshape(batch, self.sp * local_heads, seq // self.sp, dim)

    def kv_repeats(self, heads: int, kv_heads: int) -> int:
        """How often each key/value head is repeated so that S divides their count (1: not at all)."""
        group = heads // kv_heads
        return next(r for r in range(1, group + 1) if group % r == 0 and (kv_heads * r) % self.sp == 0)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        repeats = self.kv_repeats(q.shape[1], k.shape[1])
        if repeats > 1:
            k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        if k.shape[1] == q.shape[1]:
            # One all-to-all for q, k and v together, instead of three.
            q_full, k_full, v_full = self.sequence_to_heads(torch.stack((q, k, v))).unbind(0)
        else:
            q_full = self.sequence_to_heads(q.unsqueeze(0)).squeeze(0)
            k_full, v_full = self.sequence_to_heads(torch.stack((k, v))).unbind(0)
        return self.heads_to_sequence(self.attention(q_full, k_full, v_full))
