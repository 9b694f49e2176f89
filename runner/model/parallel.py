"""Device mesh, sequence parallelism and FSDP2 sharding of a model (`runner.model.registry`).

The W ranks are one 1-D mesh (`everyone`: the loss collectives), unflattened
into the two views a run needs, as torchtitan's `ParallelDims.build_mesh`
unflattens its world mesh into a data mesh and a computation mesh
(pytorch/torchtitan, torchtitan/distributed/parallel_dims.py at
0119de156de558030726b8539ef0078d8aaaec99):

- `world` (dp, sp): a rank's rows of the batch and its chunk of the sequence;
  Ulysses attention runs on `sp`.
- `fsdp`: `everyone` itself when R = dp_replicate = 1 (FSDP over all W ranks),
  else (replicate, shard_sp) of sizes (R, W / R), which `fully_shard` takes as
  HSDP: parameters placed (Replicate(), Shard(0)), gradients reduce-scattered
  over `shard_sp` (torchtitan's dp_shard_cp), then all-reduced over `replicate`.

Both are row-major over the same ranks, replicate outermost and sp innermost
(rank = (replica * dp_shard + shard) * sp + sp_rank), so dp rank =
replica * dp_shard + shard: the replicas take different rows of the batch.

FSDP's gradient reduction over W = R x S ranks (S = W / R), as
`_get_gradient_divide_factors` (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py)
chooses it for float32 and bfloat16, and as measured on gloo (tests/test_hsdp.py):

- mean (the default, no divide factor): reduce-scatter AVG over S, then
  all-reduce AVG over R: (1/R) sum_replicas (1/S) sum_shards g = (1/W) sum_r g_r.
- sum (divide factor 1, SUM forced): reduce-scatter SUM, all-reduce SUM, then a
  post-divide by 1: sum_r g_r over all W.
- an explicit divide factor W without forced SUM would reduce-scatter with
  PREMUL_SUM(1/W) (W is not the reduce-scatter group's size S), which gloo
  lacks: so the mean is FSDP's default, never "divide by W".

So every mode's gradient is the same multiple of grad L at any R.

With tensor parallelism (tp = T > 1) the W ranks are a 3-D mesh (dp, sp, tp),
tp innermost; `world` is its (dp, sp) view, FSDP shards over the flattened
dp x sp data ranks, whose group is the loss's, and `tp` is each rank's
tensor-parallel group (`runner.model.tensor_parallel`); under HSDP the mesh
is (replicate, shard, sp, tp) and FSDP's is (replicate, shard x sp).

With pipeline parallelism (pp = P > 1) a pp dim comes outermost, (pp, dp, sp,
tp): each rank holds one stage (`runner.model.pipeline_parallel`), FSDP
shards it over the data ranks of its stage, which are also the loss's group,
and `pp` is each rank's pipeline (one rank per stage), over which the
activations and their gradients are sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from runner.config import MixedPrecisionConfig
from runner.layout import ParallelLayout
from runner.model.tensor_parallel import apply_tensor_parallel
from runner.model.ulysses import UlyssesAttention


@dataclass(frozen=True)
class Meshes:
    world: DeviceMesh  # 2-D (dp, sp): the data split and Ulysses
    fsdp: DeviceMesh  # FSDP's: `everyone` when dp_replicate = 1, else 2-D (replicate, shard_sp): HSDP
    everyone: DeviceMesh  # 1-D, all W ranks
    loss_group: dist.ProcessGroup  # the data ranks (dp x sp): the loss collectives and N (all W at tp = 1)
    tp: DeviceMesh | None = None  # 1-D, this rank's tensor-parallel group; None at tp = 1
    pp: DeviceMesh | None = None  # 1-D, this rank's pipeline (one rank per stage); None at pp = 1
    all_ranks: dist.ProcessGroup | None = None  # all W ranks where they are not the loss group (tp or pp > 1)

    @property
    def world_group(self) -> dist.ProcessGroup:
        """All W ranks: the metrics' gather, checkpoints and the stop signal's agreement."""
        return self.all_ranks if self.all_ranks is not None else self.loss_group

    def group_kinds(self) -> dict[str, str]:
        """For the collective counter: FSDP's all-reduce over the replicas is `replica_all_reduce`, and tensor
        parallelism's collectives are `tp_` and their op (`tp_all_gather`, ...), pipeline parallelism's `pp_`
        (`pp_send`, `pp_recv`, and the stages' loss and norm: `pp_all_reduce`), none of them the loss's."""
        kinds = {}
        if self.tp is not None:
            kinds[self.tp.get_group().group_name] = "tp_{}"
        if self.pp is not None:
            kinds[self.pp.get_group().group_name] = "pp_{}"
        if self.fsdp.ndim == 2:
            kinds[self.fsdp["replicate"].get_group().group_name] = "replica_all_reduce"
        return kinds

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
    if layout.tp > 1 or layout.pp > 1:
        return _model_parallel_meshes(layout, device_type)
    everyone = init_device_mesh(device_type, (layout.world_size,), mesh_dim_names=("dp_sp",))
    world = everyone._unflatten(0, (layout.dp, layout.sp), ("dp", "sp"))
    if not layout.replicated:
        return Meshes(world=world, fsdp=everyone, everyone=everyone, loss_group=everyone.get_group())
    fsdp = everyone._unflatten(0, (layout.dp_replicate, layout.fsdp_shards), ("replicate", "shard_sp"))
    # The loss collectives get a group of their own, so the collective counter tells them from FSDP's all-reduce
    # over the replicas: under DDP that spans every rank and is the default group, as `everyone`'s is.
    return Meshes(world=world, fsdp=fsdp, everyone=everyone, loss_group=dist.new_group())


def _model_parallel_meshes(layout: ParallelLayout, device_type: str) -> Meshes:
    """Views of all W ranks, as `build_meshes` unflattens them: (pp, dp, sp, tp) for the data split, the stages
    and tp, the data ranks (dp x sp: the loss's group, and FSDP's mesh), and under HSDP (replicate, shard x sp)
    for FSDP's 2-D mesh, each on this rank's stage. pp is outermost and tp innermost, as in torchtitan's
    ParallelDims: rank = ((stage * dp + dp_rank) * sp + sp_rank) * tp + tp_rank, with dp_rank = replica *
    dp_shard + shard (a dim of size 1 is left out). The tp ranks of one group, and the stages of one pipeline,
    hold the same tokens, so no loss collective and no count spans them."""
    everyone = init_device_mesh(device_type, (layout.world_size,), mesh_dim_names=("all",))

    def view(*dims: tuple[str, int]) -> DeviceMesh:
        kept = [(name, size) for name, size in dims if size > 1 or name in ("dp", "sp", "dp_sp")]
        return everyone._unflatten(0, tuple(size for _, size in kept), tuple(name for name, _ in kept))

    stages, tp = ("pp", layout.pp), ("tp", layout.tp)
    split = view(stages, ("dp", layout.dp), ("sp", layout.sp), tp)
    data = view(stages, ("dp_sp", layout.data_ranks), tp)["dp_sp"]
    fsdp = data
    if layout.replicated:
        sizes = (("replicate", layout.dp_replicate), ("shard_sp", layout.fsdp_shards))
        fsdp = view(stages, *sizes, tp)["replicate", "shard_sp"]
    return Meshes(
        world=split["dp", "sp"],
        fsdp=fsdp,
        everyone=everyone,
        loss_group=data.get_group(),
        tp=split["tp"] if layout.tp > 1 else None,
        pp=split["pp"] if layout.pp > 1 else None,
        all_ranks=dist.group.WORLD,
    )


def mixed_precision_policy(mp: MixedPrecisionConfig | None) -> MixedPrecisionPolicy:
    """FSDP2's policy from `mp.param_dtype` / `mp.reduce_dtype` (float32 and float32: full precision)."""
    if mp is None:
        return MixedPrecisionPolicy()
    param_dtype = getattr(torch, mp.param_dtype.value)
    reduce_dtype = getattr(torch, mp.reduce_dtype.value)
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)


def parallelize(
    model: nn.Module,
    meshes: Meshes,
    fsdp_reduction: str = "mean",
    mp: MixedPrecisionConfig | None = None,
    loss_parallel: bool = False,
) -> nn.Module:
    """Tensor parallelism's plan when tp > 1 (`runner.model.tensor_parallel`); Ulysses attention when sp > 1;
    fully_shard per layer (`model.layers()`) and at the root on FSDP's mesh
    (all W ranks, HSDP's replicas of W / R shards, or the W / tp data ranks).

    `fsdp_reduction` "sum" turns FSDP's gradient mean over W into a true sum over W (`fsdp_sum`).
    With a bfloat16 `mp.reduce_dtype`, no mode reaches PREMUL_SUM (whose bf16
    path is the one a known PyTorch issue zeroes): the mean is FSDP's default
    ReduceOp.AVG (over the replicas too) and the sum is a forced plain SUM.
    """
    if meshes.tp is not None:
        apply_tensor_parallel(model, meshes.tp, loss_parallel)
    if meshes.world["sp"].size() > 1:
        model.use_attention(UlyssesAttention(meshes.sp_group))
    policy = mixed_precision_policy(mp)
    for layer in model.layers():
        fully_shard(layer, mesh=meshes.fsdp, mp_policy=policy)
    fully_shard(model, mesh=meshes.fsdp, mp_policy=policy)
    if fsdp_reduction != "mean":
        set_gradient_reduction(model, fsdp_reduction)
    return model


def set_gradient_reduction(model: nn.Module, fsdp_reduction: str) -> None:
    """FSDP's gradient reduction over all W ranks: "sum" (a true sum), or "mean" (FSDP's default).

    Both setters act on one FSDP module only, so apply them to every one.
    Divide factor 1.0 alone asks for PREMUL_SUM, which gloo lacks; forcing
    SUM-only comms makes it a plain SUM on every backend (reduce-scatter and,
    under HSDP, the replicas' all-reduce). The mean is FSDP's own default,
    restored as it was built (no divide factor, no forced SUM): ReduceOp.AVG
    over the shards and over the replicas. A divide factor of W instead would
    be PREMUL_SUM under HSDP (the module docstring). (The cost measurement
    switches one model between modes with this.)
    """
    if fsdp_reduction not in ("mean", "sum"):
        raise ValueError(f"FSDP reduction {fsdp_reduction!r}: valid: mean, sum")
    summing = fsdp_reduction == "sum"
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # None is FSDPParamGroup's initial gradient_divide_factor: FSDP's default mean.
            module.set_gradient_divide_factor(1.0 if summing else None)
            module.set_force_sum_reduction_for_comms(summing)
