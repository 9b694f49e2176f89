"""Rules about the machine the ranks start on, checked there: by the launching process on this machine, or
by the job on a cluster node.

- refused (exit 2, the job `invalid`): more CPU ranks than `CPU_RANKS_PER_CORE` per core, unless
  `dist.oversubscribe=true`; a CPU rank's estimated memory beyond its share (`runner.sweep.memory`);
- skipped (the job `skipped`; a single run exits 2): valid, but this machine lacks what it asks for
  (`device=cuda` without a CUDA device, more ranks than GPUs).
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig

from runner.sweep.memory import machine_memory_bytes, memory_problems

# More gloo ranks than this per core spend their time in the scheduler, not training.
CPU_RANKS_PER_CORE = 4


def visible_cuda_devices() -> int:
    # Without an NVIDIA device node there is no CUDA device: skip importing torch
    # in the launcher (about a second of every single job's fixed cost).
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def usable_cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine_problems(
    cfg: DictConfig, *, cuda_devices: int, cpu_cores: int, machine_bytes: int | None = None
) -> list[tuple[str, str]]:
    """(field, message) for each machine rule a valid config breaks here."""
    on_cpu = cfg.device.value == "cpu" or (cfg.device.value == "auto" and cuda_devices == 0)
    if not on_cpu:
        return []
    limit = CPU_RANKS_PER_CORE * cpu_cores
    if cfg.world_size > limit and not cfg.dist.oversubscribe:
        return [
            (
                "world_size",
                f"world_size={cfg.world_size} would start {cfg.world_size} CPU ranks on this machine's {cpu_cores} cores; "
                f"valid: world_size<={limit} ({CPU_RANKS_PER_CORE} ranks per core), or dist.oversubscribe=true to run it anyway",
            )
        ]
    machine_bytes = machine_memory_bytes() if machine_bytes is None else machine_bytes
    return memory_problems(cfg, ranks_here=cfg.world_size, machine_bytes=machine_bytes)


def machine_shortfall(cfg: DictConfig, cuda_devices: int) -> str | None:
    """Why this machine cannot run a valid config (a sweep's job is then skipped), or None."""
    if cfg.device.value == "cuda" and cuda_devices == 0:
        return "device=cuda but no CUDA device is visible; use device=auto or device=cpu"
    uses_cuda = cfg.device.value == "cuda" or (cfg.device.value == "auto" and cuda_devices > 0)
    if uses_cuda and cfg.world_size > cuda_devices:
        return (
            f"world_size={cfg.world_size} needs one GPU per rank but {cuda_devices} are visible; "
            f"use world_size<={cuda_devices} or device=cpu"
        )
    return None
