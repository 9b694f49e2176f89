"""The launcher's side of `runner.world.fork_server`: rank processes forked from a server that has torch imported.

One server per launcher process (a sweep runs all its jobs in one), started at the first job and kept
while the launcher lives. `start_rank` gives a handle with what `runner.sweep.spawn` uses of a
`subprocess.Popen` (pid, poll, send_signal). Where the server cannot start or has died, `start_rank`
returns None and the caller starts a fresh interpreter as before: the server only saves time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from runner.world.env import fork_server_wanted

_START_TIMEOUT_S = 120.0  # the server's imports: about 2.5 s on two quiet cores, far more under load
_REPLY_TIMEOUT_S = 30.0


class ForkedRank:
    """A child of the fork server, as much of `subprocess.Popen` as the launcher needs."""

    def __init__(self, server: ForkServer, pid: int):
        self._server, self.pid, self.returncode = server, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass


class ForkServer:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._pids: dict[int, int | str] = {}  # request id -> pid (or the error)
        self._codes: dict[int, int] = {}
        self._next_id = 0
        # Born with SIGINT and SIGTERM blocked (a mask survives exec): a terminal's Ctrl-C or a kill of the
        # launcher's process group is the launcher's to act on; the server ends when the launcher does.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "runner.world.fork_server"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=None,
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        self._ready, self._eof = False, False
        threading.Thread(target=self._read_replies, daemon=True).start()

    def _read_replies(self) -> None:
        for raw in iter(self._process.stdout.readline, b""):
            message = json.loads(raw)
            with self._changed:
                if message.get("ready"):
                    self._ready = True
                elif "code" in message:
                    self._codes[message["pid"]] = message["code"]
                else:
                    self._pids[message["id"]] = message.get("pid") or message.get("error", "no pid")
                self._changed.notify_all()
        with self._changed:  # the server is gone: its children's ends can no longer be reported
            self._eof = True
            self._changed.notify_all()

    def alive(self) -> bool:
        return not self._eof and self._process.poll() is None

    def start(self, module: str, argv: list[str], env: dict[str, str], log: Path) -> ForkedRank | None:
        with self._changed:
            self._changed.wait_for(lambda: self._ready or not self.alive(), _START_TIMEOUT_S)
            if not self._ready or not self.alive():
                return None
            request_id, self._next_id = self._next_id, self._next_id + 1
        request = {"id": request_id, "module": module, "argv": argv, "env": env, "cwd": os.getcwd(), "log": str(log)}
        try:
            self._process.stdin.write((json.dumps(request) + "\n").encode())
            self._process.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        with self._changed:
            self._changed.wait_for(lambda: request_id in self._pids or not self.alive(), _REPLY_TIMEOUT_S)
            pid = self._pids.pop(request_id, None)
        return ForkedRank(self, pid) if isinstance(pid, int) else None

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            if pid in self._codes:
                return self._codes.pop(pid)
        if self.alive():
            return None
        # The server died first: its orphaned child is no longer ours to wait for. Gone means ended;
        # how, nobody can say any more.
        return None if Path(f"/proc/{pid}").exists() else 1

    def close(self) -> None:
        if self.alive():
            self._process.stdin.close()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()


_server: ForkServer | None = None
_lock = threading.Lock()


def prestart() -> ForkServer | None:
    """The server, started now if it is not running (its imports then overlap what the launcher does next)."""
    global _server
    if not fork_server_wanted():
        return None
    with _lock:
        if _server is None or not _server.alive():
            _server = ForkServer()
        return _server


def start_rank(module: str, argv: list[str], env: dict[str, str], log: Path) -> ForkedRank | None:
    """Fork `python -m MODULE ARGV` from the server (started on first use), or None: start it yourself."""
    server = prestart()
    return None if server is None else server.start(module, argv, env, log)
