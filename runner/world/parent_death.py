"""A process that ends with its parent: Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG, SIGKILL)`).

A launcher killed outright (SIGKILL, the OOM killer) runs no handler, so it cannot stop its ranks; left
running, they would go on writing a folder whose lock is free again, beside the next launcher's world.
Each rank and the fork server therefore ask the kernel to kill them when their parent ends: a fresh rank's
parent is the launcher, a forked rank's the fork server, whose parent is the launcher. The signal follows
the thread that started the child, so the launcher starts them from its main thread. Elsewhere (not Linux)
this does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int | None = None) -> None:
    """In the child: be killed when the parent ends; `parent_pid` given, end now if it already has."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return  # best effort: the rank runs as before
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the parent died between the fork and the prctl
