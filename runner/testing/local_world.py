"""Run a function on every rank of a real gloo world of CPU processes; collect what each returns.

For the tests and the benchmarks: `fn` must be importable (a module-level
function). The ranks get their environment from
`runner.world.env.spawned_rank_environ` and join through
`runner.world.env.init_world`, the same code the runner uses.

The ranks are forked from multiprocessing's forkserver with torch preloaded
(one server per calling process, started at its first world): a world then
starts in a fraction of a second instead of each rank importing torch anew
(about 2.3 s a rank). A rank gets the caller's environment as it is at the
call; where that differs from the server's in a variable read at import
(`runner.world.import_env`), the world is started with spawn instead, so a
rank never differs from a fresh interpreter.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import traceback
from pathlib import Path

import torch

from runner.world import import_env
from runner.world.env import init_world, leave_world, rank_env, spawned_rank_environ

_PRELOAD = ["torch", "runner.world.env", "runner.testing.local_world"]
# Set in the caller by torch itself, not by the user: inductor writes its default cache folder into the
# environment the first time it looks for it (torch/_inductor/runtime/cache_dir_utils.py, `cache_dir`), and
# the preload does not read it (tests/test_local_world.py traces the preload's reads and holds this).
SET_BY_TORCH_AFTER_IMPORT = frozenset({"TORCHINDUCTOR_CACHE_DIR"})
_server_environ: dict[str, str] | None = None  # the caller's environment when the forkserver started


def _rank_main(fn, args, rank: int, world_size: int, folder: str, environ: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(environ)
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


def _context() -> multiprocessing.context.BaseContext:
    """The forkserver's context, or spawn's where the caller's environment has left the server's behind."""
    global _server_environ
    if _server_environ is None:
        _server_environ = dict(os.environ)
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)
        return context
    if set(import_env.differences(_server_environ, os.environ)) - SET_BY_TORCH_AFTER_IMPORT:
        return multiprocessing.get_context("spawn")
    return multiprocessing.get_context("forkserver")


def run_in_world(fn, world_size: int, *args, timeout_s: float = 300.0) -> list:
    """fn(*args) on ranks 0..world_size-1; returns their results in rank order."""
    context = _context()
    environ = dict(os.environ)
    with tempfile.TemporaryDirectory() as folder:
        processes = [
            context.Process(target=_rank_main, args=(fn, args, rank, world_size, folder, environ))
            for rank in range(world_size)
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
