"""The tests' gloo worlds: ranks forked from a preloaded forkserver behave as fresh interpreters would.

`runner.testing.local_world.run_in_world` forks its ranks from multiprocessing's forkserver (torch
preloaded). A rank must still see the caller's environment as it is at the call, and where the caller has
changed a variable read at import since the server started, the world must be spawned: a forked rank would
carry the server's thread count, not the one asked for.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from runner.testing import local_world
from tests.gloo_world import run_in_world


def _what_the_rank_sees() -> tuple[str | None, int, int]:
    return os.environ.get("LOCAL_WORLD_PROBE"), torch.get_num_threads(), os.getppid()


def test_a_rank_sees_the_callers_environment_and_a_changed_import_variable_gets_fresh_ranks(monkeypatch):
    run_in_world(_what_the_rank_sees, 2)  # the forkserver is running from here on (if this was the first world)
    caller = os.getpid()

    monkeypatch.setenv("LOCAL_WORLD_PROBE", "set after the server started")
    forked = run_in_world(_what_the_rank_sees, 2)
    assert [probe for probe, _, _ in forked] == ["set after the server started"] * 2
    assert all(parent != caller for _, _, parent in forked), "the ranks were not forked from the server"

    threads = 1 if torch.get_num_threads() != 1 else 3
    with monkeypatch.context() as changed:
        changed.setenv("OMP_NUM_THREADS", str(threads))
        fresh = run_in_world(_what_the_rank_sees, 2)
    assert [count for _, count, _ in fresh] == [threads] * 2
    assert all(parent == caller for _, _, parent in fresh), "a changed OMP_NUM_THREADS must give spawned ranks"

    again = run_in_world(_what_the_rank_sees, 2)
    assert all(parent != caller for _, _, parent in again), "the server's environment again: forked ranks"


def test_what_torch_sets_in_the_caller_is_not_read_by_the_preload_and_keeps_ranks_forked(monkeypatch):
    traced = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from runner.world import import_env; print(*import_env.reads_of({local_world._PRELOAD}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    read = set(traced.stdout.split())
    assert {"TORCH_LOGS", "PYTORCH_JIT"} <= read, traced  # the trace sees what torch reads at import
    assert not read & local_world.SET_BY_TORCH_AFTER_IMPORT

    run_in_world(_what_the_rank_sees, 2)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/a/folder/inductor/set/as/its/default")
    forked = run_in_world(_what_the_rank_sees, 2)
    assert all(parent != os.getpid() for _, _, parent in forked)
