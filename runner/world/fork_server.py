"""Ranks forked from one process that has imported torch already: `python -m runner.world.fork_server`.

A rank started as a fresh interpreter spends about 2.5 s importing torch, numpy, W&B and the
distributed modules before it does anything, and a sweep starts every rank of every job that way: on
two cores, more than the training of a short job. This server imports them once (`PRELOADED`, third-party
modules only, never the runner's own, so that a changed file is read by the next rank as it would be by
a new interpreter), then forks one child per request. The child becomes what `python -m MODULE ARGS`
would have been: the request's environment, working directory, `sys.path` and `sys.argv`, its output
in the request's log file, and the process title `python -m MODULE ARGS` (so `ps` and `pkill -f` see the
rank as before). Nothing in the server runs torch: no thread pool or device is started before a fork.

Protocol (one JSON object a line): requests on stdin
    {"id": N, "module": M, "argv": [...], "env": {...}, "cwd": D, "log": PATH}
replies on stdout
    {"id": N, "pid": P}            once forked (or {"id": N, "error": "..."} when the fork failed)
    {"pid": P, "code": C}          when the child ends: its exit status as subprocess gives it
                                   (negative: killed by that signal)
The server exits when its stdin closes (its launcher ended), and is killed when its launcher is; its
children are killed when it ends (`runner.world.parent_death`): no rank outlives the launcher.
The server blocks SIGINT and SIGTERM (a terminal's Ctrl-C, a kill of the launcher's process group: the
launcher's to act on, `runner.sweep.spawn`); a child unblocks SIGTERM and keeps SIGINT blocked, as a rank
the launcher starts itself is born.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import sys

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
    "setproctitle",
)
_REAP_EVERY_S = 0.05
_SERVER_PYTHONPATH = os.environ.get("PYTHONPATH", "")  # the server's own, left out of a child's sys.path


def _become(request: dict) -> None:
    """In the forked child: turn into `python -m MODULE ARGV` with the request's environment, then run it."""
    module, argv = request["module"], list(request["argv"])
    import setproctitle

    # First: it moves the environment out of the way of the longer title, which it cannot do once replaced.
    setproctitle.setproctitle(" ".join([sys.executable, "-m", module, *argv]))
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.close(_replies)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # line-buffered: the launcher echoes rank 0's lines
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    sys.stdin = open(0, closefd=False)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    # sys.path as `python -m` in that directory with that PYTHONPATH would have it: the directory first,
    # then PYTHONPATH's entries, then the interpreter's own (what this server started with, less its own
    # directory and PYTHONPATH).
    own = {os.path.abspath(p) for p in [sys.path[0], *_SERVER_PYTHONPATH.split(os.pathsep)] if p}
    extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if os.path.abspath(p) not in own]
    sys.path[:] = [os.getcwd(), *extra, *base]
    sys.argv = [module, *argv]
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


_replies = 1  # the launcher's pipe: fd 1 as the server was started (W&B's import wraps sys.stdout's writes)


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
        _reply({"pid": pid, "code": os.waitstatus_to_exitcode(status)})


def serve() -> None:
    global _replies
    die_with_parent()  # the launcher, killed outright, takes the server (and so its ranks) with it
    server = os.getpid()
    _replies = os.dup(1)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # as the launcher started it
    for name in PRELOADED:
        importlib.import_module(name)
    _reply({"ready": True, "pid": os.getpid()})
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
            request = json.loads(line)
            try:
                pid = os.fork()
            except OSError as error:
                _reply({"id": request["id"], "error": f"fork failed: {error}"})
                continue
            if pid == 0:
                try:
                    die_with_parent(server)  # a rank ends with the server, which ends with the launcher
                    _become(request)
                finally:
                    os._exit(1)
            _reply({"id": request["id"], "pid": pid})


if __name__ == "__main__":
    serve()
