"""The parallel layout of one job: how W ranks split into data and sequence parallelism.

Built once from the config, validated before any process starts, and printed
readably (`DP(2)-SP(1)-GA(4)`), which also names the run.
"""

from __future__ import annotations

from dataclasses import dataclass

# Sequence parallelism arrives with the Ulysses issue; until then only sp=1 runs.
SUPPORTED_SP = (1,)


@dataclass(frozen=True)
class ParallelLayout:
    world_size: int
    sp: int
    grad_accum: int

    @classmethod
    def from_config(cls, cfg) -> "ParallelLayout":
        return cls(world_size=cfg.world_size, sp=cfg.sp, grad_accum=cfg.grad_accum)

    @property
    def dp(self) -> int:
        return self.world_size // self.sp

    @property
    def sp_enabled(self) -> bool:
        return self.sp > 1

    def __str__(self) -> str:
        return f"DP({self.dp})-SP({self.sp})-GA({self.grad_accum})"

    def problems(self, *, global_batch: int, seq_len: int, n_heads: int) -> list[tuple[str, str]]:
        """(field, message) for every rule the layout breaks; empty when it is valid."""
        found: list[tuple[str, str]] = []
        if self.world_size < 1:
            found.append(("world_size", f"world_size={self.world_size} must be >= 1"))
        if self.grad_accum < 1:
            found.append(("grad_accum", f"grad_accum={self.grad_accum} must be >= 1"))
        if self.sp not in SUPPORTED_SP:
            found.append(
                ("sp", f"sp={self.sp} is not supported yet (sequence parallelism is not built); valid: sp=1")
            )
            return found
        if self.world_size < 1 or self.grad_accum < 1:
            return found
        if self.world_size % self.sp:
            found.append(("sp", f"world_size={self.world_size} is not divisible by sp={self.sp}"))
            return found
        if n_heads % self.sp:
            found.append(("sp", f"model.n_heads={n_heads} is not divisible by sp={self.sp}"))
        if seq_len % self.sp:
            found.append(("sp", f"train.seq_len={seq_len} is not divisible by sp={self.sp}"))
        split = self.dp * self.grad_accum
        if global_batch % split:
            lower = max(split, global_batch - global_batch % split)
            found.append(
                (
                    "train.global_batch",
                    f"train.global_batch={global_batch} cannot be split evenly over "
                    f"dp * grad_accum = {self.dp} * {self.grad_accum} = {split}; "
                    f"use a multiple of {split} (e.g. {lower} or {lower + split})",
                )
            )
        return found
