"""Start the W rank processes of one job on this machine, watch them, and report how they ended.

Each rank is forked from `runner.world.fork_server` (torch imported once a sweep; `runner.sweep.forked`)
or, where that server is off or cannot start, started as a fresh `python -m runner.world.worker`.

Every rank's output goes to JOB_DIR/logs/rank<r>.log; rank 0's is also echoed
to this terminal, with each distinct framework warning shown once per sweep.
When a rank fails, the others are stopped (they would wait in a collective
forever); past the timeout, all are. Ranks start with SIGINT blocked: a Ctrl-C
is the launcher's (`runner.sweep.interrupts`), which stops them with SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from runner.sweep import interrupts
from runner.sweep.forked import ForkedRank
from runner.sweep.forked import start_rank as forked_rank
from runner.world.env import spawned_rank_environ
from runner.world.parent_death import die_with_parent

_POLL_S = 0.1
_GRACE_S = 5.0  # how long the other ranks of a failed rank get to exit on their own
_LOG_TAIL_LINES = 25
# Warnings already echoed by this process (a sweep runs its jobs in one process).
_shown_warnings: set[str] = set()


@dataclass
class WorldOutcome:
    returncodes: list[int | None]
    timed_out: bool
    interrupted: int  # the signal that stopped the job (SIGINT, SIGTERM), else 0
    wall_s: float
    # The ranks that had ended non-zero when the launcher first saw a failure, before it stopped any: a rank killed
    # from outside (the OOM killer's SIGKILL) has a negative code as the ones it stopped do, and is told by this.
    ended_first: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.returncodes) and not self.timed_out and not self.interrupted


def _show(raw: bytes) -> None:
    line = raw.decode(errors="replace")
    if line.startswith("[warning]") or line.startswith("[W"):
        key = line.split("]", 1)[-1].strip() if line.startswith("[W") else line
        if key in _shown_warnings:
            return
        _shown_warnings.add(key)
    sys.stdout.write(line)
    sys.stdout.flush()


def _echo(stream, log_file) -> None:
    """Rank 0's output, from its pipe into its log file and onto this terminal."""
    for raw in iter(stream.readline, b""):
        log_file.write(raw)
        log_file.flush()
        _show(raw)


def _echo_file(path: Path, process: ForkedRank) -> None:
    """A forked rank 0 writes its log file itself: show each line as it lands there, until the rank ends."""
    with open(path, "rb") as log:
        partial = b""
        while True:
            ended = process.poll() is not None  # before the read: a line written before the end is still read
            chunk = log.readline()
            while chunk:
                partial += chunk
                if partial.endswith(b"\n"):
                    _show(partial)
                    partial = b""
                chunk = log.readline()
            if ended:
                if partial:
                    _show(partial + b"\n")
                return
            time.sleep(_POLL_S / 2)


@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT blocked in this thread for the block, and so in a process it starts (a signal mask survives exec):
    a terminal's Ctrl-C reaches the whole process group, but a rank leaves it to the launcher, which stops the
    ranks (SIGTERM) and records the job, instead of dying mid-import with a traceback. A SIGINT that arrives
    meanwhile waits, and reaches this process's handler when the block ends."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _wait_for_exit(processes: Sequence[subprocess.Popen], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def _stop(processes: Sequence[subprocess.Popen], grace_s: float = 0.0, term_wait_s: float = 5.0) -> None:
    """Let the ranks exit on their own for `grace_s`, then SIGTERM (waiting `term_wait_s`: a checkpointing
    rank saves its step first), then SIGKILL."""
    _wait_for_exit(processes, grace_s)
    for sig, wait_s in ((signal.SIGTERM, term_wait_s), (signal.SIGKILL, 5.0)):
        for p in processes:
            if p.poll() is None:
                p.send_signal(sig)
        _wait_for_exit(processes, wait_s)


def run_world(
    world_size: int,
    job_dir: Path,
    worker_args: Sequence[str],
    *,
    timeout_s: float,
    module: str = "runner.world.worker",
    signals: list[int] | None = None,
    term_wait_s: float = 5.0,
) -> WorldOutcome:
    """Run `python -m MODULE JOB_DIR *worker_args --spawned-at T` as ranks 0..world_size-1 and wait.

    MODULE is the job's worker; a benchmark passes a stand-in rank program. `signals` is the caller's
    `interrupts.held(deliver=False)` list: a SIGINT or SIGTERM noted there stops the ranks (polled every
    0.1 s, never raised mid-way) and the outcome says so. Without it, the world holds signals itself and
    delivers one after the ranks are stopped and the logs closed. `term_wait_s`: how long stopped ranks get
    between SIGTERM and SIGKILL (a checkpointing job's save their step first: `runner.train.stop_request`).
    """
    holding = contextlib.nullcontext(signals) if signals is not None else interrupts.held()
    with holding as arrived:
        return _run_world(world_size, job_dir, worker_args, timeout_s, module, arrived, term_wait_s)


def _run_world(world_size, job_dir, worker_args, timeout_s, module, arrived: list[int], term_wait_s) -> WorldOutcome:
    logs = job_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # A FileStore in a fresh folder: no fixed port, no clash between concurrent sweeps.
    rendezvous_dir = tempfile.mkdtemp(prefix="runner-rdzv-")
    processes: list[subprocess.Popen] = []
    log_files = []
    echo_thread = None
    started = time.monotonic()
    timed_out, interrupted, ended_first = False, 0, ()
    try:
        spawned_at = f"{time.time():.6f}"
        for rank in range(world_size if not arrived else 0):
            environ = spawned_rank_environ(
                os.environ, rank=rank, world_size=world_size, rendezvous_file=os.path.join(rendezvous_dir, "store")
            )
            log_path = logs / f"rank{rank}.log"
            argv = [str(job_dir), *worker_args, "--spawned-at", spawned_at]
            echo = rank == 0
            log_path.write_bytes(b"")
            with _sigint_blocked():  # the rank is born with SIGINT blocked: Ctrl-C is the launcher's to act on
                forked = forked_rank(module, argv, environ, log_path)
                if forked is None:
                    log_file = open(log_path, "wb")
                    log_files.append(log_file)
                    command = [sys.executable, "-m", module, *argv]
                    stdout = subprocess.PIPE if echo else log_file
                    process = subprocess.Popen(
                        command, env=environ, stdout=stdout, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
                    )
                else:
                    process = forked
            processes.append(process)
            if echo:
                follow = (_echo, (process.stdout, log_file)) if forked is None else (_echo_file, (log_path, process))
                echo_thread = threading.Thread(target=follow[0], args=follow[1], daemon=True)
                echo_thread.start()
        deadline = started + timeout_s
        while arrived or any(p.poll() is None for p in processes):
            if arrived:
                interrupted = arrived[0]
                _stop(processes, term_wait_s=term_wait_s)
                break
            if any(p.poll() not in (None, 0) for p in processes):
                ended_first = tuple(rank for rank, p in enumerate(processes) if p.poll() not in (None, 0))
                # Survivors may be recording the same error, or blocked in a collective with the dead rank.
                _stop(processes, grace_s=_GRACE_S)
                break
            if time.monotonic() > deadline:
                timed_out = True
                _stop(processes, term_wait_s=term_wait_s)
                break
            time.sleep(_POLL_S)
    finally:
        _stop(processes)  # whatever happened above (nothing, unless this process failed): no rank left running
        if echo_thread is not None:
            echo_thread.join(timeout=5.0)
        for log_file in log_files:
            log_file.close()
        shutil.rmtree(rendezvous_dir, ignore_errors=True)
    if arrived and not interrupted:  # during the last poll or the clean-up: the job still ended as it did
        interrupted = arrived[0] if any(code != 0 for code in (p.poll() for p in processes)) else 0
    codes = [p.poll() for p in processes]
    return WorldOutcome(codes, timed_out, interrupted, time.monotonic() - started, ended_first)


def log_tail(job_dir: Path, rank: int, lines: int = _LOG_TAIL_LINES) -> str:
    path = job_dir / "logs" / f"rank{rank}.log"
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _its_log_ends(job_dir: Path, rank: int) -> str:
    """The last lines the rank printed, labelled, or "" when it printed nothing (not a dangling colon)."""
    tail = log_tail(job_dir, rank)
    return f"; its log ends:\n{tail}" if tail.strip() else f" (logs/rank{rank}.log is empty)"


def failure_report(
    job_dir: Path, returncodes: Sequence[int | None], ended_first: Sequence[int] = ()
) -> tuple[int | None, str]:
    """(root-cause rank, error text) of a world whose ranks did not all exit 0.

    A rank killed by a signal before the launcher stopped any (`ended_first`: the OOM killer's SIGKILL) is
    the first suspect, then one that exited non-zero without an error record (os._exit, a crash): its peers
    raise and record later, in their next collective ("Connection reset by peer"). Otherwise the earliest
    record is. Ranks this launcher stopped (negative codes, not among `ended_first`) are never the cause.
    """
    records = {}
    for path in (job_dir / "logs").glob("rank*.error.json"):
        record = json.loads(path.read_text())
        records[record["rank"]] = record
    killed = [r for r in ended_first if (returncodes[r] or 0) < 0 and r not in records]
    if killed:
        rank, name = killed[0], signal.Signals(-returncodes[killed[0]]).name
        why = " (the kernel's OOM killer sends it when memory runs out: dmesg says)" if name == "SIGKILL" else ""
        return (
            rank,
            f"rank {rank} was killed by {name}{why}, before any peer failed; its peers' errors follow from it"
            + _its_log_ends(job_dir, rank),
        )
    silent = [r for r, code in enumerate(returncodes) if code is not None and code > 0 and r not in records]
    if silent:
        rank = silent[0]
        return (
            rank,
            f"rank {rank} exited with code {returncodes[rank]} without an error record" + _its_log_ends(job_dir, rank),
        )
    if records:
        first = min(records.values(), key=lambda record: record["time"])
        return first["rank"], f"rank {first['rank']}: {first['error']}\n{first['traceback']}"
    for rank, code in enumerate(returncodes):
        if code not in (0, None):
            return rank, f"rank {rank} exited with code {code}" + _its_log_ends(job_dir, rank)
    return None, "the ranks did not finish"
