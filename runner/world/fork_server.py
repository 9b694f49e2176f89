"""Ranks forked from one process that has imported torch already: `python -m runner.world.fork_server`.

A rank started as a fresh interpreter spends about 2.5 s importing torch, numpy, W&B and the
distributed modules before it does anything, and a sweep starts every rank of every job that way: on
two cores, more than the training of a short job. This server imports them once (`PRELOADED`, third-party
modules only, never the runner's own, so that a changed file is read by the next rank as it would be by
a new interpreter), then forks one child per request. The child becomes what `python -m MODULE ARGS`
would have been: the request's environment, working directory, `sys.path` and `sys.argv`, its output
in the request's log file, and `/proc/PID/cmdline` and `/proc/PID/environ` those of `python -m MODULE ARGS`
with that environment (so `ps`, `ps e` and `pkill -f` see the rank as before; `runner.world.proc_identity`).
Nothing in the server runs torch, and numpy's BLAS threads are ended after the preload: the server has one
thread when it forks (it checks, and refuses a request otherwise), and the child starts the BLAS pool again.
What the interpreter and the preload read from the environment (`runner.world.import_env`) is the server's:
the launcher sends only requests whose environment agrees with the server's there.

Protocol (one JSON object a line): requests on stdin
    {"id": N, "module": M, "argv": [...], "env": {...}, "cwd": D, "log": PATH}
    {"cancel": N}                  a request given up on: the child forked for it, if any, is killed
replies on stdout
    {"ready": true, "pid": S}      once the preload is done (or {"ready": false, "why": "..."}: it cannot
                                   fork faithful ranks here, and exits)
    {"id": N, "pid": P}            once forked (or {"id": N, "error": "..."} when it did not fork)
    {"id": N, "cancelled": P}      the child of request N killed (P null: there was none)
    {"pid": P, "code": C}          when the child ends: its exit status as subprocess gives it
                                   (negative: killed by that signal)
Only the replies go to that pipe: whatever else the server prints goes to its stderr.
The server exits when its stdin closes (its launcher ended), and is killed when its launcher is; its
children are killed when it ends (`runner.world.parent_death`): no rank outlives the launcher.
The server blocks SIGINT and SIGTERM (a terminal's Ctrl-C, a kill of the launcher's process group: the
launcher's to act on, `runner.sweep.spawn`); a child unblocks SIGTERM and keeps SIGINT blocked, as a rank
the launcher starts itself is born.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import select
import signal
import sys

from runner.world import proc_identity
from runner.world.parent_death import die_with_parent

# What a rank imports that does not change between ranks: torch and its distributed modules, numpy,
# OmegaConf and Hydra (the rank's config), W&B (rank 0's run). Each is imported once, here.
PRELOADED = (
    "numpy",
    "torch",
    "torch.distributed",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch.distributed.checkpoint",
    "omegaconf",
    "hydra.core.config_store",
    "wandb",
)
_REAP_EVERY_S = 0.05
_SERVER_PYTHONPATH = os.environ.get("PYTHONPATH", "")  # the server's own, left out of a child's sys.path
_children: dict[int, int] = {}  # request id -> pid, while the child runs


def _streams(unbuffered: bool) -> None:
    """sys.stdout, stderr and stdin on fds 1, 2 and 0, as a fresh interpreter opens them (PYTHONUNBUFFERED too)."""
    for name, fd, mode in (("stdout", 1, "w"), ("stderr", 2, "w"), ("stdin", 0, "r")):
        like = getattr(sys, f"__{name}__")
        raw = io.FileIO(fd, mode, closefd=False)
        if mode == "r":
            binary = io.BufferedReader(raw)
        else:
            binary = raw if unbuffered else io.BufferedWriter(raw)
        line_buffering = not unbuffered and (raw.isatty() or name == "stderr")
        text = io.TextIOWrapper(
            binary, encoding=like.encoding, errors=like.errors, line_buffering=line_buffering, write_through=unbuffered
        )
        setattr(sys, name, text)
        setattr(sys, f"__{name}__", text)


def _become(request: dict) -> None:
    """In the forked child: turn into `python -m MODULE ARGV` with the request's environment, then run it."""
    module, argv = request["module"], list(request["argv"])
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.close(_replies)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    refused = proc_identity.set_identity([sys.executable, "-m", module, *argv], request["env"])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _streams(unbuffered=bool(os.environ.get("PYTHONUNBUFFERED")))
    if refused:  # the server checked that it could: not expected
        print(f"fork_server: /proc/{os.getpid()}/cmdline and environ are the server's ({refused})", file=sys.stderr)
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    # sys.path as `python -m` in that directory with that PYTHONPATH would have it: the directory first,
    # then PYTHONPATH's entries, then the interpreter's own (what this server started with, less its own
    # directory and PYTHONPATH).
    own = {os.path.abspath(p) for p in [sys.path[0], *_SERVER_PYTHONPATH.split(os.pathsep)] if p}
    extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if os.path.abspath(p) not in own]
    sys.path[:] = [os.getcwd(), *extra, *base]
    sys.argv = [module, *argv]
    proc_identity.start_blas_threads()  # as big as it was in the server: the same environment made it
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # SIGINT stays blocked, as in a spawned rank
    code = 0
    try:
        import runpy

        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int) and stop.code is not None:
            print(stop.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    os._exit(code)


_replies = 1  # the launcher's pipe, moved off fd 1 at start (W&B's import wraps sys.stdout's writes)


def _reply(message: dict) -> None:
    try:
        os.write(_replies, (json.dumps(message) + "\n").encode())
    except BrokenPipeError:  # the launcher is gone (it ended, or it never needed a rank): so is the server
        os._exit(0)


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        for request_id in [r for r, child in _children.items() if child == pid]:
            del _children[request_id]
        _reply({"pid": pid, "code": os.waitstatus_to_exitcode(status)})


def _unfit() -> str | None:
    """Why this server cannot fork a rank that is what a fresh interpreter would be, or None."""
    others = proc_identity.other_threads()
    if others:
        return f"threads besides its own in the server ({', '.join(others)}), where a fork needs none"
    with open("/proc/self/cmdline", "rb") as cmdline, open("/proc/self/environ", "rb") as environ:
        argv = [os.fsdecode(arg) for arg in cmdline.read().split(b"\0")[:-1]]
        entries = [entry.split(b"=", 1) for entry in environ.read().split(b"\0") if b"=" in entry]
    env = {os.fsdecode(key): os.fsdecode(value) for key, value in entries}
    return proc_identity.set_identity(argv, env)  # its own again, unchanged: can the kernel be told?


def _handle(request: dict, server: int) -> None:
    if "cancel" in request:
        pid = _children.pop(request["cancel"], None)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        _reply({"id": request["cancel"], "cancelled": pid})
        return
    others = proc_identity.other_threads()
    if others:  # a thread started since the preload: the child would lack it
        _reply({"id": request["id"], "error": f"threads besides its own in the server: {', '.join(others)}"})
        return
    try:
        pid = os.fork()
    except OSError as error:
        _reply({"id": request["id"], "error": f"fork failed: {error}"})
        return
    if pid == 0:
        try:
            die_with_parent(server)  # a rank ends with the server, which ends with the launcher
            _become(request)
        finally:
            os._exit(1)
    _children[request["id"]] = pid
    _reply({"id": request["id"], "pid": pid})


def serve() -> None:
    global _replies
    die_with_parent()  # the launcher, killed outright, takes the server (and so its ranks) with it
    server = os.getpid()
    _replies = os.dup(1)
    os.dup2(2, 1)  # what the server or its imports print goes to its stderr, never among the replies
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # as the launcher started it
    for name in PRELOADED:
        importlib.import_module(name)
    proc_identity.stop_blas_threads()  # numpy's pool: its threads would not survive a fork
    why = _unfit()
    if why:
        _reply({"ready": False, "why": why})
        return
    _reply({"ready": True, "pid": server})
    requests = sys.stdin.buffer
    pending = b""
    while True:
        readable, _, _ = select.select([requests], [], [], _REAP_EVERY_S)
        _reap()
        if not readable:
            continue
        chunk = os.read(requests.fileno(), 65536)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            try:
                request = json.loads(line)
            except ValueError:
                print(f"fork_server: a request that is not JSON, ignored: {line[:200]!r}", file=sys.stderr)
                continue
            _handle(request, server)


if __name__ == "__main__":
    serve()
