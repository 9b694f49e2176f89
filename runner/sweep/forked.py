"""The launcher's side of `runner.world.fork_server`: rank processes forked from a server that has torch imported.

One server per launcher process (a sweep runs all its jobs in one), started at the first job and kept
while the launcher lives. `start_rank` gives a handle with what `runner.sweep.spawn` uses of a
`subprocess.Popen` (pid, poll, send_signal). Where the server cannot start or has died, `start_rank`
returns None and the caller starts a fresh interpreter as before: the server only saves time. So it does
for a rank whose environment differs from the server's in a variable read at import (`runner.world.import_env`),
and for a request the server has not answered in time, once the child it may have forked for it is killed
and gone (asked of the server; one that does not answer that either is killed with all its children): one
rank is never two processes. A line from the server that is not a reply is noted on stderr and skipped.
A server that cannot fork faithful ranks, or had to be killed, is retired: fresh interpreters from then on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from runner.world import import_env
from runner.world.env import fork_server_wanted

_START_TIMEOUT_S = 120.0  # the server's imports: about 2.5 s on two quiet cores, far more under load
_REPLY_TIMEOUT_S = 30.0
_CANCEL_TIMEOUT_S = 10.0  # a cancelled request's answer, then its child's end
_LOST_CODE_WAIT_S = 2.0


class ForkedRank:
    """A child of the fork server, as much of `subprocess.Popen` as the launcher needs."""

    def __init__(self, server: ForkServer, pid: int):
        self._server, self.pid, self.returncode = server, pid, None

    def poll(self) -> int | None:
        """The exit code once known. The launcher's loop and rank 0's log echo both poll; the server's report is
        handed to one of them, so a poll that comes back empty-handed never overwrites a code the other got."""
        if self.returncode is None:
            code = self._server.exit_code(self.pid)
            if code is not None:
                self.returncode = code
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
        self._starting = threading.Lock()  # one request at a time: a timed-out one is settled before the next
        self._pids: dict[int, int | str] = {}  # request id -> pid (or the error)
        self._cancelled: dict[int, int | None] = {}  # request id -> the pid killed for it (None: none was forked)
        self._codes: dict[int, int] = {}
        self._next_id = 0
        self.retired: str | None = None  # why no rank is to be forked here any more
        # What the server's interpreter and imports read of it is what its ranks get (runner.world.import_env).
        self.env = dict(os.environ)
        # Born with SIGINT and SIGTERM blocked (a mask survives exec): a terminal's Ctrl-C or a kill of the
        # launcher's process group is the launcher's to act on; the server ends when the launcher does.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "runner.world.fork_server"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=None,
                env=self.env,
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        self._ready, self._eof = False, False
        threading.Thread(target=self._read_replies, daemon=True).start()

    def _read_replies(self) -> None:
        try:
            for raw in iter(self._process.stdout.readline, b""):
                with self._changed:
                    try:
                        self._take(json.loads(raw))
                    except (ValueError, KeyError, TypeError, AttributeError):
                        # Not a reply (the reply it may have been is lost: its request times out and is cancelled)
                        _note(f"a line from the fork server that is not a reply, skipped: {raw[:200]!r}")
                        continue
                    self._changed.notify_all()
        finally:  # the server is gone (or this thread failed): its children's ends can no longer be reported
            with self._changed:
                self._eof = True
                self._changed.notify_all()

    def _take(self, message: dict) -> None:
        if "ready" in message:
            if not message["ready"]:
                self._retire(f"the fork server cannot fork ranks here: {message.get('why')}")
            self._ready = True
        elif "code" in message:
            self._codes[int(message["pid"])] = int(message["code"])
        elif "cancelled" in message:
            self._cancelled[int(message["id"])] = None if message["cancelled"] is None else int(message["cancelled"])
        else:
            pid = message.get("pid")
            self._pids[int(message["id"])] = int(pid) if pid is not None else str(message.get("error", "no pid"))

    def _retire(self, why: str) -> None:
        if self.retired is None:
            self.retired = why
            _note(f"{why}; ranks start as fresh interpreters from now on")

    def alive(self) -> bool:
        return self.retired is None and self.reporting()

    def reporting(self) -> bool:
        """Whether the server still reports the ends of its children: running, even if retired (forks no more)."""
        return not self._eof and self._process.poll() is None

    def start(self, module: str, argv: list[str], env: dict[str, str], log: Path) -> ForkedRank | None:
        if import_env.differences(self.env, env):
            return None  # the rank would not be what a fresh interpreter with that environment is
        with self._starting:
            return self._start(module, argv, env, log)

    def _start(self, module: str, argv: list[str], env: dict[str, str], log: Path) -> ForkedRank | None:
        with self._changed:
            self._changed.wait_for(lambda: self._ready or not self.alive(), _START_TIMEOUT_S)
            if not self._ready or not self.alive():
                return None
            request_id, self._next_id = self._next_id, self._next_id + 1
        request = {"id": request_id, "module": module, "argv": argv, "env": env, "cwd": os.getcwd(), "log": str(log)}
        if not self._send(request):  # it has died, or is dying: its children with it (parent-death signal)
            return None
        with self._changed:
            self._changed.wait_for(lambda: request_id in self._pids or not self.alive(), _REPLY_TIMEOUT_S)
            pid = self._pids.pop(request_id, None)
        if isinstance(pid, int):
            return ForkedRank(self, pid)
        if pid is None:  # no answer: whatever the server forked for it ends before the caller starts the rank
            self._cancel(request_id)
        return None

    def _send(self, message: dict) -> bool:
        try:
            self._process.stdin.write((json.dumps(message) + "\n").encode())
            self._process.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def _cancel(self, request_id: int) -> None:
        """The child forked for a request that got no answer in time, if any, is killed and gone on return."""
        if self._send({"cancel": request_id}):
            with self._changed:
                self._changed.wait_for(lambda: request_id in self._cancelled or not self.alive(), _CANCEL_TIMEOUT_S)
                answered, pid = request_id in self._cancelled, self._cancelled.pop(request_id, None)
                self._pids.pop(request_id, None)  # its late answer, if it came
                if answered and pid is not None:
                    self._changed.wait_for(lambda: pid in self._codes or not self.alive(), _CANCEL_TIMEOUT_S)
                    answered = self._codes.pop(pid, None) is not None
            if answered:
                return
        if self._process.poll() is None:  # (a server that died by itself took its children with it)
            self._stop_server(f"the fork server did not answer request {request_id} in time")

    def _stop_server(self, why: str) -> None:
        """Kill the server and every child it has, and wait until they are gone; fork no rank here again."""
        self._retire(why)
        children = _children_of(self._process.pid)
        self._process.kill()
        self._process.wait()
        for pid in children:  # killed with the server too (parent-death signal): not left to that alone
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + _CANCEL_TIMEOUT_S
        while any(_running(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.01)

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            if pid in self._codes:
                return self._codes.pop(pid)
        if not self.reporting():
            # The server died first: its orphaned child is no longer ours to wait for. Gone means ended;
            # how, nobody can say any more. (A retired server that still runs reports its children as before.)
            return None if _running(pid) else 1
        if _parent(pid) == self._process.pid:
            return None  # running, or ended and about to be reaped by the server, which then reports it
        with self._changed:  # reaped: the server writes its report right after, and it is on its way
            if self._changed.wait_for(lambda: pid in self._codes, _LOST_CODE_WAIT_S):
                return self._codes.pop(pid)
        if self.reporting():
            # Late, not lost (a loaded machine: 2 s passed once between the reap and the reply, and a rank that
            # had finished was taken as failed): a living server reports every child it reaps. Asked again at
            # the launcher's next poll.
            return None
        _note(f"rank process {pid} ended and the fork server's report of how was lost: taken as failed")
        return 1

    def close(self) -> None:
        if self.reporting():  # retired or not: a running server is asked to end, and waited for
            self._process.stdin.close()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()


def _note(line: str) -> None:
    print(f"runner: {line}", file=sys.stderr, flush=True)


def _stat(pid: int) -> list[str] | None:
    """Fields (3) on of /proc/PID/stat (proc(5)'s numbering), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def _running(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _parent(pid: int) -> int | None:
    fields = _stat(pid)
    return None if fields is None else int(fields[1])


def _children_of(parent: int) -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and _parent(int(name)) == parent]


_server: ForkServer | None = None  # retired, it stays: no server is started again
_lock = threading.Lock()


def prestart() -> ForkServer | None:
    """The server, started now if it is not running (its imports then overlap what the launcher does next)."""
    global _server
    if not fork_server_wanted():
        return None
    with _lock:
        if _server is not None and _server.retired is not None:
            return None
        if _server is None or not _server.alive():
            _server = ForkServer()
        return _server


def start_rank(module: str, argv: list[str], env: dict[str, str], log: Path) -> ForkedRank | None:
    """Fork `python -m MODULE ARGV` from the server (started on first use), or None: start it yourself."""
    server = prestart()
    return None if server is None else server.start(module, argv, env, log)
