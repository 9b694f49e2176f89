"""The only module that reads (or writes) the launcher's environment variables.

A rank comes to life in one of three ways:

- spawned by `runner.sweep.spawn` for one Hydra job: RANK, WORLD_SIZE, LOCAL_RANK,
  LOCAL_WORLD_SIZE and RUNNER_RENDEZVOUS_FILE are set by `spawned_rank_environ`.
  Rendezvous goes through a FileStore in a fresh temporary folder, so no port
  is fixed and two sweeps at once cannot clash;
- started by torchrun (or any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR
  and MASTER_PORT): the job joins that world with `env://` instead of spawning;
- one task of a SLURM job step with more than one task (`srun`, or Hydra's
  submitit launcher with `nodes` x `tasks_per_node` > 1): rank SLURM_PROCID of
  SLURM_NTASKS, local rank SLURM_LOCALID, rendezvous over TCP at the first host
  of SLURM_JOB_NODELIST (MASTER_ADDR / MASTER_PORT override it), the port
  derived from the job id so that two jobs on one node do not clash. A SLURM
  job with one task is not a world: the runner spawns its ranks on that node.

RUNNER_FORK_SERVER=0 (read by `fork_server_wanted`) makes the spawner start each rank
as a fresh interpreter rather than fork it from `runner.world.fork_server`.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

RENDEZVOUS_FILE = "RUNNER_RENDEZVOUS_FILE"
FORK_SERVER = "RUNNER_FORK_SERVER"  # 0: start every rank as a fresh interpreter (runner.world.fork_server)
# Set by an outer launcher, if any: a world spawned here replaces them all.
_LAUNCHER_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", RENDEZVOUS_FILE)


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    init_method: str  # "file://..." when spawned here, "env://" under torchrun, "tcp://..." under SLURM
    launcher: str = "runner"  # "runner" (spawned here), "torchrun" or "slurm"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def rank_env(environ: Mapping[str, str] | None = None) -> RankEnv | None:
    """This process's place in a distributed world, or None outside one."""
    environ = os.environ if environ is None else environ
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return _slurm_rank_env(environ)
    world_size = int(environ["WORLD_SIZE"])
    rendezvous_file = environ.get(RENDEZVOUS_FILE)
    return RankEnv(
        rank=int(environ["RANK"]),
        world_size=world_size,
        local_rank=int(environ.get("LOCAL_RANK", environ["RANK"])),
        local_world_size=int(environ.get("LOCAL_WORLD_SIZE", world_size)),
        init_method=f"file://{rendezvous_file}" if rendezvous_file else "env://",
        launcher="runner" if rendezvous_file else "torchrun",
    )


def _slurm_rank_env(environ: Mapping[str, str]) -> RankEnv | None:
    tasks = int(environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or 1)
    if "SLURM_PROCID" not in environ or tasks < 2:
        return None
    nodes = int(environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_JOB_NUM_NODES") or 1)
    host = environ.get("MASTER_ADDR") or first_host(environ.get("SLURM_STEP_NODELIST") or environ["SLURM_JOB_NODELIST"])
    job_digits = re.sub(r"\D", "", environ.get("SLURM_JOB_ID", "0")) or "0"
    port = environ.get("MASTER_PORT") or str(20000 + int(job_digits) % 20000)
    return RankEnv(
        rank=int(environ["SLURM_PROCID"]),
        world_size=tasks,
        local_rank=int(environ.get("SLURM_LOCALID", 0)),
        local_world_size=max(1, tasks // nodes),
        init_method=f"tcp://{host}:{port}",
        launcher="slurm",
    )


def fork_server_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Ranks forked from `runner.world.fork_server` (Linux, unless RUNNER_FORK_SERVER=0)."""
    environ = os.environ if environ is None else environ
    return sys.platform.startswith("linux") and environ.get(FORK_SERVER, "1") != "0"


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: `gpu[07-09,12],cpu3` -> `gpu07`."""
    match = re.match(r"([^,\[]+)(?:\[([^,\-\]]+))?", nodelist.strip())
    if match is None:
        raise ValueError(f"cannot read a host from the SLURM node list {nodelist!r}")
    return match.group(1) + (match.group(2) or "")


def spawned_rank_environ(
    base: Mapping[str, str], *, rank: int, world_size: int, rendezvous_file: str
) -> dict[str, str]:
    """The environment of rank `rank` of a world started on this machine."""
    environ = {key: value for key, value in base.items() if key not in _LAUNCHER_KEYS}
    environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        PYTHONUNBUFFERED="1",
    )
    environ[RENDEZVOUS_FILE] = rendezvous_file
    return environ


def init_world(env: RankEnv, device_type: str, timeout_s: float = 600.0):
    """Join the process group: gloo on CPU, NCCL on CUDA. Returns the torch.device of this rank."""
    import torch
    import torch.distributed as dist

    if device_type == "cuda":
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
        # Ranks share this machine's cores: split them rather than oversubscribe.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // env.local_world_size))
    dist.init_process_group(
        backend=backend,
        init_method=env.init_method,
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device_type == "cuda" else None,
    )
    return device


def resolve_device_type(requested: str, cuda_available: bool) -> str:
    if requested == "auto":
        return "cuda" if cuda_available else "cpu"
    return requested


def leave_world() -> None:
    """Barrier, then destroy the group: a rank left to tear gloo down at interpreter exit sometimes aborts."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
