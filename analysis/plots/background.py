"""A second process that draws the per-group figures while the analysis goes on.

It is forked when a `Background` is made, so make one while no other thread is
at work (a forked child inherits whatever locks those threads hold), and
before the big allocations (every page shared at the fork costs a fault and a
copy when either process writes it): the analysis makes one before its load.
Jobs reach it pickled, as plain Python and NumPy objects, so it runs no Arrow
code. Where the platform cannot fork, a job
runs in this process when it is submitted.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor


class Background:
    def __init__(self) -> None:
        self._pool = None
        if "fork" in multiprocessing.get_all_start_methods():
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"))
            self._pool.submit(int)  # forks the worker now, while this process has no other thread at work

    def submit(self, fn, *args) -> Future:
        """`fn(*args)` in the forked process (or here, now, where there is none)."""
        if self._pool is not None:
            return self._pool.submit(fn, *args)
        done = Future()
        done.set_result(fn(*args))
        return done

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
