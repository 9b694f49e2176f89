"""VeOmni's FSDP2 grad norm before and after its fix (`bug=grad_norm_wrong_group`; fixed by ByteDance-Seed/VeOmni
PR #862; the same bug as modelscope/twinkle PR #290's 0.8 logged as 1.131 = 0.8 sqrt 2). At 7c38f425 this norm
ran on the CPU-offload and expert-parallel paths only: the default path called DTensor's `clip_grad_norm_`
(whose own group, VeOmni #184, PR #185 fixed). A paraphrase: VeOmni is not packaged here. Read at
ByteDance-Seed/VeOmni, the commits and lines named in `BEFORE` / `AFTER`.

The loss is right in both arms: the step's token mean, W S_rsm / N under FSDP's mean, so the gradient is grad L.
Only the norm that is logged and clipped with differs. Each rank sums the squares of its local gradient shards,
q_r = sum_p ||g_p,r||^2, and the squares are summed over a process group, then the square root is taken:

- `norm_over_fsdp_group` (before the fix): over VeOmni's `fsdp_group`, its `dp_sp` mesh, i.e. every dp and sp
  rank: all W. Under HSDP the R replicas hold the same shards, so sum_W q_r = R ||grad||^2 and the norm is
  sqrt(R) ||grad||: sqrt 2 at dp_replicate = 2 (plain DDP at W = 2, each rank one replica of all of it).
  Clipping to optim.clip then scales the update by 1 / sqrt(R) too much wherever it binds.
- `norm_over_shard_group` (after): over the ranks that own distinct shards, the shard side of the FSDP mesh
  (VeOmni's `dp_shard` or `dp_shard_sp` group; none when a replica is one rank): ||grad|| at any layout.
  Here the group is read off the gradient's DTensor: the mesh dims it is Shard() on.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from runner.train.custom_rule import custom_rule
from runner.train.upstream import Source, Tested

BEFORE = Source(
    "ByteDance-Seed/VeOmni",
    "7c38f42504282987f0555b3c7210fb5b1226db6e (the parent of PR #862's merge 3506c435)",
    (
        "veomni/distributed/fsdp2/clip_grad_norm.py L54-70: _cpu_offload_fsdp2_clip_grad_norm, "
        'reduce_groups=[("fsdp", ps.fsdp_group)] (and L88, L114 in extra_parallel_fsdp2_clip_grad_norm)',
        "veomni/distributed/fsdp2/clip_grad_norm.py L173-193: _local_pth_sum (each local shard's norm ** p, summed)",
        "veomni/distributed/fsdp2/clip_grad_norm.py L216-240: _fsdp2_reduce_group (all_reduce SUM over each group)",
        'veomni/distributed/parallel_state.py L234-237: fsdp_group = device_mesh.get_group("dp_sp")',
    ),
)
AFTER = Source(
    "ByteDance-Seed/VeOmni",
    "3506c435421fec0b5f799524f4f81141a0970fc5 (PR #862's merge)",
    (
        "veomni/distributed/fsdp2/clip_grad_norm.py L51-64: _fsdp_grad_norm_reduce_groups (plain FSDP2: fsdp_group; "
        "HSDP: dp_shard_sp or dp_shard group, none when dp_shard_size is 1)",
    ),
)

CASES = Tested(  # every test of the file: the after arm's local sum of squares and its groups
    "upstream_tests",
    "tests/test_upstream_cases_veomni.py",
    "ByteDance-Seed/VeOmni@3506c43 and @46a59d6 tests/utils/test_fsdp2_clip_grad_norm.py: the cases of "
    "_local_pth_sum (p = 2) and of _fsdp_grad_norm_reduce_groups a 2-process world holds",
    via=("_local_squares", "_shard_groups", "_over_shard_group"),
)


def _local_squares(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """`_local_pth_sum` at p = 2: this rank's local shards' norms, squared and summed (float32)."""
    local = [(g.to_local() if isinstance(g, DTensor) else g).detach().float() for g in grads]
    if not local:
        return torch.zeros((), dtype=torch.float32, device=device)
    return torch.stack(torch._foreach_pow(torch._foreach_norm(local, 2), 2)).sum().to(device)


def _token_mean(logits, labels, ctx):
    """The step's token mean: W S_rsm / N (N the runner's global count), FSDP's mean: grad L."""
    total = F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=ctx.ignore_index, reduction="sum"
    )
    loss = total * ctx.world_size / ctx.global_tokens
    return loss, loss.detach()


def _over_fsdp_group(grads, ctx) -> torch.Tensor:
    """Before PR #862: the squares summed over every dp x sp rank (`fsdp_group`), replicas included."""
    squares = _local_squares(grads, ctx.device)
    dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=ctx.world_group)
    return squares.sqrt()


def _shard_groups(grads) -> list[dist.ProcessGroup]:
    """The groups of the FSDP mesh dims the gradients are sharded on (size > 1): one replica's shards."""
    grad = next((g for g in grads if isinstance(g, DTensor)), None)
    if grad is None:
        return []
    mesh = grad.device_mesh
    return [
        mesh.get_group(dim)
        for dim, placement in enumerate(grad.placements)
        if placement.is_shard() and mesh.size(dim) > 1
    ]


def _over_shard_group(grads, ctx) -> torch.Tensor:
    """After PR #862: the squares summed over the shard side of the FSDP mesh only."""
    squares = _local_squares(grads, ctx.device)
    for group in _shard_groups(grads):
        dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=group)
    return squares.sqrt()


@custom_rule(upstream=(BEFORE,), grad_norm=_over_fsdp_group)
def norm_over_fsdp_group(logits, labels, ctx):
    """The step's token mean; the grad norm over the whole FSDP group (sqrt(R) x under HSDP)."""
    return _token_mean(logits, labels, ctx)


@custom_rule(upstream=(AFTER, CASES), grad_norm=_over_shard_group)
def norm_over_shard_group(logits, labels, ctx):
    """The step's token mean; the grad norm over the shard group (the true norm)."""
    return _token_mean(logits, labels, ctx)
