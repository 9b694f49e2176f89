"""One launcher per job folder: an advisory lock (`flock`) on `<job>/launcher.lock`, held for the job's life.

Two launchers writing one folder would interleave two runs' metrics and checkpoints under one summary. The
second is refused before it reads or writes anything of the folder, with the holder's pid, command and start.
The kernel drops an `flock` when its holder dies, however it dies, so a lock is never stale; the file's text
(who held it) outlives a holder killed outright, and the next launcher says that it takes it over.
The file stays in place between jobs (removing a lock file lets a third process lock a file no longer there).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = "launcher.lock"


class FolderInUse(RuntimeError):
    """Another launcher holds the job folder's lock."""


def _holder(text: str) -> dict:
    try:
        holder = json.loads(text)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _described(holder: dict) -> str:
    started = holder.get("started")
    when = time.strftime("%H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {holder.get('pid', '?')}, started {when}: {holder.get('command', '?')}"


def _command() -> str:
    """This launcher's command line as it was typed (`python -m runner ...`)."""
    program = Path(sys.argv[0])
    head = f"python -m {program.parent.name}" if program.name == "__main__.py" else program.name
    return " ".join([head, *sys.argv[1:]])


@contextmanager
def held(job_dir: Path) -> Iterator[str | None]:
    """Hold `job_dir`'s lock for the block; yields a sentence when it took over from a launcher that died
    holding it (else None). Raises FolderInUse, naming the holder, when another launcher holds it."""
    job_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(job_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(os.pread(fd, 65536, 0).decode(errors="replace"))
            raise FolderInUse(
                f"{job_dir} is in use by another launcher ({_described(holder)}); two launchers in one folder "
                f"would write one run's files twice. Wait for it to end, stop it (kill {holder.get('pid', 'PID')}), "
                "or give this run another folder (hydra.run.dir= or hydra.sweep.dir=)"
            ) from None
        previous = _holder(os.pread(fd, 65536, 0).decode(errors="replace"))
        took_over = None
        if previous.get("pid") and previous.get("pid") != os.getpid() and not _alive(previous["pid"]):
            took_over = (
                f"took over {job_dir}'s lock from a launcher that ended without releasing it ({_described(previous)})"
            )
        record = {"pid": os.getpid(), "command": _command(), "started": round(time.time(), 3)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        try:
            yield took_over
        finally:
            os.ftruncate(fd, 0)  # released in order: nobody to take over from
    finally:
        os.close(fd)  # drops the lock
