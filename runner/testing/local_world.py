"""Run a function on every rank of a real gloo world of CPU processes; collect what each returns.

For the tests and the benchmarks: `fn` must be importable (a module-level
function). The ranks get their environment from
`runner.world.env.spawned_rank_environ` and join through
`runner.world.env.init_world`, the same code the runner uses.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import traceback
from pathlib import Path

import torch

from runner.world.env import init_world, leave_world, rank_env, spawned_rank_environ


def _rank_main(fn, args, rank: int, world_size: int, folder: str) -> None:
    os.environ.update(
        spawned_rank_environ(os.environ, rank=rank, world_size=world_size, rendezvous_file=f"{folder}/store")
    )
    try:
        init_world(rank_env(), "cpu", timeout_s=120)
        result = fn(*args)
        torch.save(result, f"{folder}/result{rank}.pt")
        leave_world()
        code = 0
    except BaseException:
        Path(f"{folder}/error{rank}.txt").write_text(traceback.format_exc())
        code = 1
    os._exit(code)


def run_in_world(fn, world_size: int, *args, timeout_s: float = 300.0) -> list:
    """fn(*args) on ranks 0..world_size-1; returns their results in rank order."""
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as folder:
        processes = [
            context.Process(target=_rank_main, args=(fn, args, rank, world_size, folder)) for rank in range(world_size)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout_s)
        for process in processes:
            if process.is_alive():
                process.kill()
        errors = [Path(folder, f"error{r}.txt") for r in range(world_size)]
        messages = [f"rank {r}:\n{e.read_text()}" for r, e in enumerate(errors) if e.exists()]
        codes = [p.exitcode for p in processes]
        assert not messages and codes == [0] * world_size, f"exit codes {codes}\n" + "\n".join(messages)
        return [torch.load(f"{folder}/result{rank}.pt", weights_only=False) for rank in range(world_size)]
