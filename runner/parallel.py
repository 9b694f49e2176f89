"""Device mesh, sequence parallelism and FSDP2 sharding of the decoder.

The mesh is (dp, sp). Ulysses attention runs on the sp dimension; FSDP shards
parameters over the whole dp * sp world, so the gradient reduction (mean, or
sum for `fsdp_sum`) runs over W = dp * sp.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from runner.config import Reduction
from runner.layout import ParallelLayout
from runner.model import Decoder
from runner.reduction import fsdp_sums_gradients
from runner.ulysses import UlyssesAttention


@dataclass(frozen=True)
class Meshes:
    world: DeviceMesh  # 2-D (dp, sp)
    fsdp: DeviceMesh  # 1-D, all W ranks: FSDP sharding and the loss collectives

    @property
    def world_group(self) -> dist.ProcessGroup:
        return self.fsdp.get_group()

    @property
    def sp_group(self) -> dist.ProcessGroup:
        return self.world["sp"].get_group()

    @property
    def dp_rank(self) -> int:
        return self.world.get_local_rank("dp")

    @property
    def sp_rank(self) -> int:
        return self.world.get_local_rank("sp")


def build_meshes(layout: ParallelLayout, device_type: str) -> Meshes:
    world = init_device_mesh(device_type, (layout.dp, layout.sp), mesh_dim_names=("dp", "sp"))
    return Meshes(world=world, fsdp=world["dp", "sp"]._flatten("dp_sp"))


def parallelize(model: Decoder, meshes: Meshes, mode: Reduction) -> Decoder:
    """Ulysses attention when sp > 1; fully_shard per block and at the root over all W ranks.

    `fsdp_sum` turns FSDP's gradient mean into a true sum.
    """
    if meshes.world["sp"].size() > 1:
        model.attention = UlyssesAttention(meshes.sp_group)
    for block in model.blocks:
        fully_shard(block, mesh=meshes.fsdp)
    fully_shard(model, mesh=meshes.fsdp)
    if fsdp_sums_gradients(mode):
        set_gradient_reduction(model, mode, meshes.fsdp.size())
    return model


def set_gradient_reduction(model: Decoder, mode: Reduction, world_size: int) -> None:
    """FSDP's gradient reduction for `mode`: a true sum for `fsdp_sum`, else the mean over W.

    Both setters act on one FSDP module only, so apply them to every one.
    Divide factor 1.0 alone asks for PREMUL_SUM, which gloo lacks; forcing
    SUM-only comms makes it a plain SUM on every backend. The mean is divide
    factor W without forced SUM, which FSDP turns into ReduceOp.AVG as by default.
    (The cost measurement switches one model between modes with this.)
    """
    summing = fsdp_sums_gradients(mode)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0 if summing else float(world_size))
            module.set_force_sum_reduction_for_comms(summing)
