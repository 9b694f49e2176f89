"""Whole-model gradient statistics on FSDP2's sharded (DTensor) gradients.

- `clip_gradients`: the true global L2 norm before clipping (each rank's shard
  norms combined by DTensor into one all-reduce), then clipping to `max_norm`.
- `GradientSketch`: K fixed random projections <p_k, g> of the full gradient.
  p_k is drawn per parameter name from `sketch_seed`, never from the run's
  seed or layout, so sketches of two runs compare directly: runs whose
  gradients differ by a factor c have sketches that differ by c.
"""

from __future__ import annotations

import zlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset


def _full(value: torch.Tensor) -> torch.Tensor:
    return value.full_tensor() if isinstance(value, DTensor) else value


def _local(value: torch.Tensor) -> torch.Tensor:
    return value.to_local() if isinstance(value, DTensor) else value


def clip_gradients(model: nn.Module, max_norm: float) -> tuple[float, float]:
    """(global grad norm before clipping, factor applied); max_norm <= 0 only measures."""
    parameters = [p for p in model.parameters() if p.grad is not None]
    total_norm = _full(torch.nn.utils.get_total_norm([p.grad for p in parameters], norm_type=2.0))
    if max_norm <= 0:
        return total_norm.item(), 1.0
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total_norm)
    # The same factor clip_grads_with_norm_ applies.
    clip_coef = min(1.0, max_norm / (total_norm.item() + 1e-6))
    return total_norm.item(), clip_coef


class GradientSketch:
    """K fixed projections, stored as this rank's slices in float64 (K x the shard: 8.9 MB for `tiny` at W=1).

    `partial_sums()` is this rank's share of <p_k, g>; the world's sketch is
    their sum over ranks (the trainer adds it to its one per-step gather).
    """

    def __init__(self, model: nn.Module, dim: int, sketch_seed: int):
        self.dim = dim
        self.projections: list[tuple[nn.Parameter, torch.Tensor]] = []
        for name, param in model.named_parameters():
            generator = torch.Generator().manual_seed(sketch_seed * 1_000_003 + zlib.crc32(name.encode()))
            full = torch.randn((dim, *param.shape), generator=generator)
            # A copy of this rank's slice (a view would keep all of `full` alive: K times
            # the whole model on every rank), in float64 once rather than every step.
            local = self._local_slice(full, param).reshape(dim, -1).to(torch.float64)
            del full
            self.projections.append((param, local.to(param.device)))

    @staticmethod
    def _local_slice(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        """The part of a [K, *global_shape] projection that lies on this rank's shard."""
        if not isinstance(param, DTensor):
            return full
        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        index = (slice(None),) + tuple(slice(start, start + size) for start, size in zip(offset, shape))
        return full[index]

    def partial_sums(self) -> torch.Tensor:
        """This rank's sum over its shard of p_k * g, for k < K (float64)."""
        first = self.projections[0][1]
        sketch = torch.zeros(self.dim, dtype=torch.float64, device=first.device)
        for param, projection in self.projections:
            if param.grad is not None:
                sketch += projection @ _local(param.grad).reshape(-1).double()
        return sketch
