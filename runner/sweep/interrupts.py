"""Ctrl-C (SIGINT) and SIGTERM in the launching process: stop cleanly, record, report, exit 128 + the signal.

Outside a job (Hydra composing, between the jobs of a sweep) the first of these signals raises `Interrupted`
(`install`), which Hydra's own error handling lets through (it is not an Exception); one that lands inside
OmegaConf is raised as soon as the process is out of it (`_UNSAFE_TO_INTERRUPT`). A job runs `held`: a
signal is noted, never raised, and the job acts on it where it can (before starting its ranks, or by stopping
them: `runner.sweep.spawn` polls the note), then records itself and raises `Interrupted` at its end. From the
first signal on, every later one is a note (`hold_for_good`): nothing cuts the stopping, the record or the
report short, whatever phase the job was in. `runner.__main__` catches `Interrupted`, records any job of this
invocation that Hydra had started but that recorded nothing (`runner.sweep.rerun.record_interrupted`), prints
the tally line of what this invocation did, and exits with 130 (SIGINT) or 143 (SIGTERM), as shells report a
process killed by that signal.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_noted: list[int] = []  # the signals of this process, in the order their handlers ran, once the first has arrived
# CPython runs pending handlers by signal number, not by arrival: when SIGTERM and then SIGINT land during one
# long C call (an import, under load), SIGINT's handler runs first. The wakeup fd gets each signal's number
# from the C-level handler as it arrives, so the order of arrival is kept there (`_watch_arrival`).
_wakeup_read: int | None = None
_arrival: list[int] = []  # SIGINT and SIGTERM as they arrived, read from the wakeup fd
_folders: dict[str, Path] = {}  # where this invocation's jobs go: "sweep" or "run" (`note_folder`)


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


def _note(signum, frame) -> None:
    _noted.append(signum)


# Code that an exception raised between two of its bytecodes leaves broken: OmegaConf's flag_override restores
# flags in a `finally` that fails on a half-assigned node (AttributeError: 'NoneType' object has no attribute
# '_invalidate_flags_cache'), which replaces `Interrupted` and makes Hydra print a traceback. A signal that lands
# inside it is raised once the process is out of it again (checked every `_RETRY_S`, on SIGALRM).
_UNSAFE_TO_INTERRUPT = ("omegaconf.",)
_RETRY_S = 0.005
_deferred = False  # a signal noted inside such code, to be raised once out of it


def _inside_unsafe_code(frame) -> bool:
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(_UNSAFE_TO_INTERRUPT):
            return True
        frame = frame.f_back
    return False


def _raise(signum, frame) -> None:
    hold_for_good()  # before anything else runs: a second signal can only be noted now
    _noted.append(signum)
    _raise_where_safe(frame)


def _raise_where_safe(frame) -> None:
    global _deferred
    if _inside_unsafe_code(frame):
        _deferred = True
        signal.signal(signal.SIGALRM, lambda signum, frame: _raise_where_safe(frame))
        signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
        return
    _cancel_deferred()
    raise Interrupted(_noted[0])


def _cancel_deferred() -> None:
    global _deferred
    if _deferred:
        _deferred = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install() -> None:
    """SIGINT and SIGTERM raise `Interrupted` in this process (signal handlers live in the main thread only),
    unless one has arrived already (`first_signal`): then they stay notes."""
    if _in_main_thread() and not _noted:
        for signum in SIGNALS:
            signal.signal(signum, _raise)


def _watch_arrival() -> None:
    global _wakeup_read
    if _wakeup_read is not None or not _in_main_thread():
        return
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    _wakeup_read = read


def _arrived_in_order() -> list[int]:
    if _wakeup_read is not None:
        try:
            while chunk := os.read(_wakeup_read, 512):
                _arrival.extend(signum for signum in chunk if signum in SIGNALS)
        except BlockingIOError:
            pass
    return _arrival


def hold_for_good() -> None:
    """From now on SIGINT and SIGTERM are noted, never raised (the process is stopping)."""
    if _in_main_thread():
        _watch_arrival()
        for signum in SIGNALS:
            signal.signal(signum, _note)


def block_for_exit() -> int | None:
    """Block SIGINT and SIGTERM at the system level (the interpreter's own shutdown restores the default
    handlers, which would let one kill the process mid-exit), and return the first that arrived, noted or
    pending, or None."""
    if _in_main_thread():
        _cancel_deferred()  # the first signal decides the exit from here on: nothing is to be raised
    if not hasattr(signal, "pthread_sigmask") or not _in_main_thread():
        return first_signal()
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    pending = [signum for signum in SIGNALS if signum in signal.sigpending()]
    return first_signal() or (pending[0] if pending else None)


def first_signal() -> int | None:
    """The first SIGINT or SIGTERM this process received, or None."""
    arrived = _arrived_in_order()
    return arrived[0] if arrived else (_noted[0] if _noted else None)


@contextmanager
def held(deliver: bool = True) -> Iterator[list[int]]:
    """Within the block SIGINT and SIGTERM are noted in the yielded list, not raised. With `deliver`, one that
    arrived goes to the handler before the block when the block ends; without, the caller acts on the list
    (`take`). Outside the main thread (a launcher's worker thread) signals do not arrive anyway."""
    arrived: list[int] = []
    if not _in_main_thread():
        yield arrived
        return
    if _deferred:  # a signal that landed in code unsafe to interrupt just before: the block does not begin
        _cancel_deferred()
        raise Interrupted(_noted[0])
    previous = {signum: signal.signal(signum, lambda signum, frame: arrived.append(signum)) for signum in SIGNALS}
    try:
        yield arrived
    finally:
        if arrived and not deliver:
            _noted.append(arrived[0])  # the caller acts on it: this process is interrupted from here on
        for signum, handler in previous.items():
            signal.signal(signum, _note if _noted else handler)
        if arrived and deliver:
            signal.raise_signal(arrived[0])  # the handler before the block acts now (after the block's work)


def note_folder(kind: str, folder: Path) -> None:
    """Where this invocation's jobs go: kind "sweep" (the sweep's folder) or "run" (the single run's), as Hydra
    starts (`runner.sweep.tally.JobFolders`)."""
    _folders[kind] = folder


def folders() -> dict[str, Path]:
    """{"sweep": the sweep's folder} or {"run": the single run's folder}, once Hydra has started; else {}."""
    return dict(_folders)
