"""What a forked rank needs of the kernel and of OpenBLAS to look like a fresh interpreter (Linux).

- `/proc/PID/cmdline` and `/proc/PID/environ` (what `ps`, `pkill -f` and `ps e` read) are the memory the
  kernel was told holds the arguments and the environment: at exec, the strings the new program was given.
  A forked child would show the server's. `set_identity` writes the rank's arguments and environment into
  memory of its own and points the kernel there (`prctl(PR_SET_MM, PR_SET_MM_MAP)`, allowed to an
  unprivileged process that leaves its executable alone), so that both read as a fresh `python -m ...`
  with that environment would have them.
- numpy's OpenBLAS starts its thread pool when it is loaded; a process that forks must have no other thread.
  `stop_blas_threads` ends the pool in the server after its imports (its thread count, read from the
  environment at load, stays set), and `start_blas_threads` starts it again in the child, as big as a fresh
  interpreter's.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import time

_PR_SET_MM, _PR_SET_MM_MAP = 35, 14  # linux/prctl.h
_kept: list = []  # the buffers the kernel now reads a process's arguments and environment from


def threads() -> int:
    """This process's threads, as the kernel counts them."""
    return len(os.listdir("/proc/self/task"))


def other_threads(settle_s: float = 0.5) -> list[str]:
    """The names of this process's threads other than the calling one, once any that are ending have gone.

    A thread that was joined can still be listed for a moment: pthread_join returns when the kernel clears
    the thread's id, before it removes the thread from /proc/self/task (a window that a loaded machine
    widens). Up to `settle_s` is given for such threads to go; one still there then is a thread alive.
    """
    deadline = time.monotonic() + settle_s
    while threads() != 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    own = str(threading.get_native_id())
    names = []
    for task in os.listdir("/proc/self/task"):
        if task != own:
            try:
                with open(f"/proc/self/task/{task}/comm") as comm:
                    names.append(comm.read().strip())
            except OSError:  # it ended since the listing
                continue
    return names


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    libc.sbrk.restype = ctypes.c_void_p
    libc.sbrk.argtypes = [ctypes.c_ssize_t]
    return libc


def set_identity(argv: list[str], env: dict[str, str]) -> str | None:
    """Make /proc/self/cmdline read `argv` and /proc/self/environ `env`; None, or why the kernel refused."""
    args = b"".join(os.fsencode(arg) + b"\0" for arg in argv)
    environ = b"".join(os.fsencode(key) + b"=" + os.fsencode(value) + b"\0" for key, value in env.items())
    arg_buffer = ctypes.create_string_buffer(args, len(args))
    env_buffer = ctypes.create_string_buffer(environ or b"\0", max(1, len(environ)))
    with open("/proc/self/stat") as stat:
        text = stat.read()
    rest = text[text.rindex(")") + 2 :].split()  # from field (3), the state, on: proc(5)'s numbering

    def field(n: int) -> int:
        return int(rest[n - 3])

    libc = _libc()
    arg_start, env_start = ctypes.addressof(arg_buffer), ctypes.addressof(env_buffer)
    # struct prctl_mm_map: code, data, brk and stack as they are; the new argument and environment areas;
    # auxv left alone (size 0); the executable left alone (fd -1).
    layout = struct.pack(
        "=11QQII",
        field(26),
        field(27),
        field(45),
        field(46),
        field(47),
        libc.sbrk(0),
        field(28),
        arg_start,
        arg_start + len(args),
        env_start,
        env_start + len(environ),
        0,
        0,
        0xFFFFFFFF,
    )
    request = ctypes.create_string_buffer(layout, len(layout))
    if libc.prctl(_PR_SET_MM, _PR_SET_MM_MAP, ctypes.addressof(request), len(layout), 0) != 0:
        return f"prctl(PR_SET_MM_MAP): {os.strerror(ctypes.get_errno())}"
    _kept[:] = [arg_buffer, env_buffer]
    return None


def _openblas() -> list[ctypes.CDLL]:
    """Each OpenBLAS library this process has loaded (numpy's, and any other)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if len(line.split()) > 5 and line.split()[-1].startswith("/")}
    return [ctypes.CDLL(path) for path in sorted(paths) if "openblas" in os.path.basename(path).lower()]


def stop_blas_threads() -> None:
    """End the thread pool of each OpenBLAS loaded (it starts again at its next call, or `start_blas_threads`)."""
    for lib in _openblas():
        shutdown = getattr(lib, "blas_thread_shutdown_", None)
        if shutdown is not None:
            shutdown()


def start_blas_threads() -> None:
    for lib in _openblas():
        init = getattr(lib, "blas_thread_init", None)
        if init is not None:
            init()
