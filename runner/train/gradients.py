"""Whole-model gradient statistics on FSDP2's sharded (DTensor) gradients.

- `clip_gradients`: the true global L2 norm before clipping (each rank's shard
  norms combined by DTensor into one all-reduce), then clipping to `max_norm`.
- `GradientSketch`: K fixed random projections <p_k, g> of the full gradient.
  p_k is drawn per parameter name from `sketch_seed`, never from the run's
  seed or layout, so sketches of two runs compare directly: runs whose
  gradients differ by a factor c have sketches that differ by c.

Under HSDP (`dp_replicate` = R > 1) a gradient is a DTensor placed
(Replicate(), Shard(0)): the R replicas hold the same shards. The norm stays
right: DTensor's local norms are Partial over the shard dim only, so its
all-reduce sums squares over one replica's shards, never over the replicas.
The sketch's sum over all W ranks would count each shard R times, so only the
ranks at replica 0 (coordinate 0 on every replicated mesh dim) keep
projections of it: the others contribute nothing.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

NormFn = Callable[[list[torch.Tensor]], torch.Tensor]  # this rank's gradients -> the global norm (0-dim)


def _full(value: torch.Tensor) -> torch.Tensor:
    return value.full_tensor() if isinstance(value, DTensor) else value


def _local(value: torch.Tensor) -> torch.Tensor:
    return value.to_local() if isinstance(value, DTensor) else value


def clip_gradients(model: nn.Module, max_norm: float, norm: NormFn | None = None) -> tuple[float, float]:
    """(global grad norm before clipping, factor applied); max_norm <= 0 only measures.

    The norm: each rank's shard norms combined by DTensor into one all-reduce, or `norm(grads)` where a
    trainer computes its own (a custom rule's `grad_norm` hook), logged and clipped with as it is.
    The factor is `clip_grads_with_norm_`'s, min(1, max_norm / (norm + 1e-6)) in
    the norm's dtype, applied to each rank's local shards: the same bits,
    without a DTensor dispatch per parameter.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total_norm = _full(torch.nn.utils.get_total_norm(grads, norm_type=2.0) if norm is None else norm(grads))
    if max_norm <= 0:
        return total_norm.item(), 1.0
    clip_coef = (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_([_local(g) for g in grads], clip_coef)
    return total_norm.item(), clip_coef.item()


def owned_square_sum(grads: list[torch.Tensor]) -> torch.Tensor:
    """This rank's share of the gradient's squared L2 norm (float64, no collective): the squares of its local
    shards of the gradients it owns (`_owned_here`); their sum over the world is the squared global norm."""
    device = _local(grads[0]).device if grads else torch.device("cpu")
    total = torch.zeros((), dtype=torch.float64, device=device)
    for grad in grads:
        if _owned_here(grad):
            total += _local(grad).double().pow(2).sum()
    return total


def _owned_here(param: torch.Tensor) -> bool:
    """Whether this rank counts `param`'s local shard in the world's sum: it is the first of the replicas
    that hold it (coordinate 0 on every mesh dim where it is Replicate()); a plain tensor is this rank's own."""
    if not isinstance(param, DTensor):
        return True
    coordinate = param.device_mesh.get_coordinate()
    return all(c == 0 for c, placement in zip(coordinate, param.placements) if placement.is_replicate())


class GradientSketch:
    """K fixed projections, stored as this rank's slices in float64 (K x the shard: 8.9 MB for `tiny` at W=1).

    `partial_sums()` is this rank's share of <p_k, g>; the world's sketch is
    their sum over ranks (the trainer adds it to its world gather, every `metrics.gather_every` steps).
    """

    def __init__(self, model: nn.Module, dim: int, sketch_seed: int):
        named = [(name, param) for name, param in model.named_parameters() if _owned_here(param)]
        self.params = [param for _, param in named]
        self.sizes = [_local(param).numel() for param in self.params]  # this rank's elements of each
        device = next(model.parameters()).device
        # [K, this rank's elements of every parameter, end to end], in float64 once rather than every step.
        self.flat = torch.empty((dim, sum(self.sizes)), dtype=torch.float64, device=device)
        self.zeros = {
            size: torch.zeros(size, device=device) for size in set(self.sizes)
        }  # for a parameter without a gradient
        start = 0
        for (name, param), size in zip(named, self.sizes):
            generator = torch.Generator().manual_seed(sketch_seed * 1_000_003 + zlib.crc32(name.encode()))
            full = torch.randn((dim, *param.shape), generator=generator)
            # Only this rank's slice is kept: K times the whole model on every rank would not fit.
            self.flat[:, start : start + size] = self._local_slice(full, param).reshape(dim, -1)
            start += size

    @staticmethod
    def _local_slice(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        """The part of a [K, *global_shape] projection that lies on this rank's shard."""
        if not isinstance(param, DTensor):
            return full
        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        index = (slice(None),) + tuple(slice(start, start + size) for start, size in zip(offset, shape))
        return full[index]

    def partial_sums(self) -> torch.Tensor:
        """This rank's sum over its shard of p_k * g, for k < K (float64): one product of the
        [K, shard] projections with the shard's gradients laid end to end."""
        grads = [
            _local(p.grad).reshape(-1) if p.grad is not None else self.zeros[n] for p, n in zip(self.params, self.sizes)
        ]
        if not grads:  # a replica other than the first: its shards are counted there
            return self.flat.new_zeros(self.flat.shape[0])
        return self.flat @ torch.cat(grads).double()
