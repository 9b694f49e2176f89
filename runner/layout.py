"""The parallel layout of one job: how W ranks split into data, sequence, tensor and pipeline parallelism.

Built once from the config, validated before any process starts, and printed
readably (`DP(2)-SP(2)-GA(4)`, `DP(2)-SP(1)-TP(2)-GA(1)`, `DP(2)-SP(1)-PP(2)-GA(2)`),
which also names the run. W = dp * sp * tp * pp ranks; Ulysses attention needs the heads and the
sequence to split evenly over sp (and, inside tensor parallelism, over sp x tp).

The tp ranks of one tensor-parallel group hold the same rows and columns of
the batch and one copy of the loss: the data ranks (dp x sp = W / tp) are
the ones whose token losses sum to L and whose valid tokens sum to N
(`runner.model.tensor_parallel`). So do the pp stages of one pipeline: each
holds some of the layers, and the last one the loss (`runner.model.pipeline_parallel`);
the data ranks are dp x sp = W / (tp x pp).

FSDP shards one copy of the model over W / dp_replicate ranks. With
dp_replicate = R > 1 (HSDP) the dp ranks form R replicas, each sharded over
dp / R of them (times sp): `DP(RxS)` names R replicas of S = dp / R shards
(`DP(2x2)-SP(1)-GA(2)`); R = dp is plain DDP (`DP(4x1)`). The replicas still
train on different rows of the batch, so the data split is over all dp ranks
whatever R is. The mesh (`runner.model.parallel`) follows torchtitan's
`ParallelDims` (pytorch/torchtitan, torchtitan/distributed/parallel_dims.py at
0119de156de558030726b8539ef0078d8aaaec99): replicate outermost, then shard, then
sequence, then tensor; FSDP's 2-D mesh is (replicate, shard x sp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def divisors(n: int) -> list[int]:
    """Every divisor of n, ascending (in about sqrt(n) steps: n may be as large as a user types)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def near_multiples(value: int, of: int) -> str:
    """The two multiples of `of` nearest `value` (the lower at least `of`), as a message suggests them."""
    lower = max(of, value - value % of)
    return f"{lower} or {lower + of}"


@dataclass(frozen=True)
class ParallelLayout:
    world_size: int
    sp: int
    grad_accum: int
    dp_replicate: int = 1  # R: replicas of the model among the dp ranks (HSDP; R = dp is DDP)
    tp: int = 1  # T: tensor-parallel ranks, which hold the same rows and columns of the batch
    pp: int = 1  # P: pipeline stages, which hold the same rows and columns of the batch and different layers

    @classmethod
    def from_config(cls, cfg) -> ParallelLayout:
        return cls(
            world_size=cfg.world_size,
            sp=cfg.sp,
            grad_accum=cfg.grad_accum,
            dp_replicate=cfg.dp_replicate,
            tp=cfg.tp,
            pp=cfg.pp,
        )

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each takes its own rows of the batch (replicas and shards alike)."""
        return self.world_size // (self.sp * self.tp * self.pp)

    @property
    def data_ranks(self) -> int:
        """dp x sp = W / (tp x pp): the ranks that hold distinct tokens, over which the loss is summed and N
        counted (on one stage: the last holds the loss)."""
        return self.dp * self.sp

    @property
    def dp_shard(self) -> int:
        """The dp ranks one replica spans (torchtitan's dp_shard)."""
        return self.dp // self.dp_replicate

    @property
    def fsdp_shards(self) -> int:
        """The ranks one copy of the model is sharded over: dp_shard x sp = W / R."""
        return self.dp_shard * self.sp

    @property
    def replicated(self) -> bool:
        return self.dp_replicate > 1

    def _dp_formula(self) -> str:
        if self.pp > 1:
            return f"world_size / (sp x tp x pp) = {self.world_size} / ({self.sp} x {self.tp} x {self.pp})"
        if self.tp > 1:
            return f"world_size / (sp x tp) = {self.world_size} / ({self.sp} x {self.tp})"
        return f"world_size / sp = {self.world_size} / {self.sp}"

    def __str__(self) -> str:
        dp = f"{self.dp_replicate}x{self.dp_shard}" if self.replicated else f"{self.dp}"
        tp = f"-TP({self.tp})" if self.tp > 1 else ""
        pp = f"-PP({self.pp})" if self.pp > 1 else ""
        return f"DP({dp})-SP({self.sp}){tp}{pp}-GA({self.grad_accum})"

    def problems(
        self, *, global_batch: int, seq_len: int, n_heads: int | None, heads_field: str = "model.n_heads"
    ) -> list[tuple[str, str]]:
        """(field, message) for every rule the layout breaks; empty when it is valid.

        `n_heads` are the model's query heads, set by `heads_field` (named in the message);
        None when the model has no valid shape (its own problem is reported elsewhere).
        """
        found: list[tuple[str, str]] = []
        sizes = (
            ("world_size", self.world_size),
            ("sp", self.sp),
            ("grad_accum", self.grad_accum),
            ("dp_replicate", self.dp_replicate),
            ("tp", self.tp),
            ("pp", self.pp),
        )
        for name, value in sizes:
            if value < 1:
                found.append((name, f"{name}={value} must be >= 1"))
        if found:
            return found
        if self.world_size % self.pp:
            valid_pp = ", ".join(map(str, divisors(self.world_size)))
            return [("pp", f"pp={self.pp} does not divide world_size={self.world_size}; valid pp: {valid_pp}")]
        if self.pp > 1 and self.world_size % (self.tp * self.pp):
            left = self.world_size // self.pp
            valid_tp = ", ".join(map(str, divisors(left)))
            return [
                (
                    "tp",
                    f"tp={self.tp} does not divide world_size / pp = {self.world_size} / {self.pp} = {left}; "
                    f"valid tp: {valid_tp}",
                )
            ]
        if self.world_size % self.tp:
            valid_tp = ", ".join(map(str, divisors(self.world_size)))
            return [("tp", f"tp={self.tp} does not divide world_size={self.world_size}; valid tp: {valid_tp}")]
        # The sp ranks split the ranks one tensor-parallel group leaves (W / tp); each tp rank holds
        # n_heads / tp heads, which Ulysses splits again over sp, and tp's sequence parallelism splits each sp
        # chunk over the tp ranks between the blocks (torchtitan's seq_len_divisor).
        ranks, split = self.world_size // (self.tp * self.pp), self.sp * self.tp
        # Suggest only degrees that pass every sp rule: they divide the ranks, the heads and the sequence.
        valid = (
            ", ".join(
                str(d)
                for d in divisors(ranks)
                if (n_heads is None or n_heads % (d * self.tp) == 0) and seq_len % (d * self.tp) == 0
            )
            or f"none at tp={self.tp}"
        )  # at tp = 1, sp = 1 always is
        of_world = f"world_size={ranks}"
        model_split = [(name, size) for name, size in (("tp", self.tp), ("pp", self.pp)) if size > 1]
        if model_split:
            names = " x ".join(name for name, _ in model_split)
            sizes = " x ".join(str(size) for _, size in model_split)
            if len(model_split) > 1:
                names, sizes = f"({names})", f"({sizes})"
            of_world = f"world_size / {names} = {self.world_size} / {sizes} = {ranks}"
        if ranks % self.sp:
            return [("sp", f"sp={self.sp} does not divide {of_world}; valid sp: {valid}")]
        over = f"sp x tp = {self.sp} x {self.tp} = {split}" if self.tp > 1 else f"sp={self.sp}"
        if n_heads is not None and n_heads % split:
            valid_for = "valid sp for this model and tp" if self.tp > 1 else "valid sp for this model"
            found.append(
                (
                    "sp",
                    f"{heads_field}={n_heads} cannot be split over {over} ranks; {valid_for}: {valid}",
                )
            )
        if seq_len % split:
            found.append(
                (
                    "train.seq_len",
                    f"train.seq_len={seq_len} cannot be split into {over} equal chunks; "
                    f"use a multiple of {split} (e.g. {near_multiples(seq_len, split)})",
                )
            )
        if self.dp % self.dp_replicate:
            found.append(
                (
                    "dp_replicate",
                    f"dp_replicate={self.dp_replicate} does not divide dp = {self._dp_formula()} = {self.dp} "
                    "(the replicas split the dp ranks evenly); "
                    f"valid dp_replicate: {', '.join(map(str, divisors(self.dp)))}",
                )
            )
        split = self.dp * self.grad_accum
        if global_batch % split:
            found.append(
                (
                    "train.global_batch",
                    f"train.global_batch={global_batch} cannot be split evenly over "
                    f"dp * grad_accum = {self.dp} * {self.grad_accum} = {split}; "
                    f"use a multiple of {split} (e.g. {near_multiples(global_batch, split)})",
                )
            )
        return found
