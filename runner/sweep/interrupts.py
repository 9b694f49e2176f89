"""Ctrl-C (SIGINT) and SIGTERM in the launching process: stop cleanly, record, report, exit 128 + the signal.

`install` makes both signals raise `Interrupted`, which Hydra's own error
handling lets through (it is not an Exception). While a job stops its ranks
and writes its summary.json, `held` notes further signals instead of raising
them, so a second Ctrl-C cannot cut the record short. `runner.__main__`
catches `Interrupted`, prints the tally line of what this invocation did, and
exits with 130 (SIGINT) or 143 (SIGTERM), as shells report a process killed by
that signal.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    def __init__(self, signum: int, *, job_dir: Path | None = None, sweep_dir: Path | None = None):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.job_dir = job_dir  # the job it stopped, when it stopped one
        self.sweep_dir = sweep_dir  # that job's sweep, when it was one

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _raise(signum, frame) -> None:
    raise Interrupted(signum)


def install() -> None:
    """SIGINT and SIGTERM raise `Interrupted` in this process (signal handlers live in the main thread only)."""
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            signal.signal(signum, _raise)


@contextmanager
def held() -> Iterator[list[int]]:
    """Within the block, SIGINT and SIGTERM are noted in the yielded list, not raised; the handlers before it
    are restored after it. Outside the main thread (a launcher's worker thread) signals do not arrive anyway."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = {signum: signal.signal(signum, lambda signum, frame: caught.append(signum)) for signum in SIGNALS}
    try:
        yield caught
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
