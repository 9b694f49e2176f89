"""The launcher's side of the fork server (`runner.sweep.forked.ForkServer.exit_code`): a rank the server has
reaped, whose report is late, is still running as far as the launcher knows while the server lives; it is
taken as failed only once the server is gone without reporting it.

On a loaded machine a report once came more than 2 s after the reap, and a rank that had finished its run
was recorded as failed ("the fork server's report of how was lost"). Held here with a stand-in server
process (a `sleep`, alive or ended) and a rank pid that has ended and been reaped.
"""

from __future__ import annotations

import subprocess
import threading

from runner.sweep import forked


def stand_in(server: subprocess.Popen) -> forked.ForkServer:
    """A ForkServer with no reader: its reports are delivered by hand (`report`)."""
    stub = object.__new__(forked.ForkServer)
    stub._changed, stub._codes, stub._process, stub.retired, stub._eof = threading.Condition(), {}, server, None, False
    return stub


def report(server: forked.ForkServer, pid: int, code: int) -> None:
    with server._changed:
        server._codes[pid] = code
        server._changed.notify_all()


def ended_pid() -> int:
    rank = subprocess.Popen(["true"])
    rank.wait()  # reaped: no /proc entry, no parent, as a rank the server has reaped
    return rank.pid


def test_a_late_report_is_waited_for_while_the_server_lives_and_a_lost_one_is_a_failure(monkeypatch, capsys):
    monkeypatch.setattr(forked, "_LOST_CODE_WAIT_S", 0.05)
    process = subprocess.Popen(["sleep", "60"])
    try:
        server, pid = stand_in(process), ended_pid()
        assert server.exit_code(pid) is None  # late: still running as far as the launcher knows
        assert server.exit_code(pid) is None and "was lost" not in capsys.readouterr().err
        report(server, pid, 0)
        assert server.exit_code(pid) == 0  # the rank's own code, when it comes
        threading.Timer(0.01, report, (server, pid, 3)).start()
        assert server.exit_code(pid) == 3  # a report within the wait is taken at once
    finally:
        process.kill()
        process.wait()
    assert server.exit_code(ended_pid()) == 1  # the server is gone and never reported it: how, nobody can say


def test_a_retired_server_that_still_runs_reports_its_ranks_ends_as_before(monkeypatch, capsys):
    # Retired (it forks no more ranks, e.g. after a cancelled request), yet running: the ranks it forked
    # before are its children still, and it reports each one's end. A late report is waited for, not a failure.
    monkeypatch.setattr(forked, "_LOST_CODE_WAIT_S", 0.05)
    process = subprocess.Popen(["sleep", "60"])
    try:
        server, pid = stand_in(process), ended_pid()
        server.retired = "it forks no more ranks here"
        assert not server.alive() and server.reporting()
        assert server.exit_code(pid) is None and "was lost" not in capsys.readouterr().err
        report(server, pid, 0)
        assert server.exit_code(pid) == 0
    finally:
        process.kill()
        process.wait()
    assert not server.reporting() and server.exit_code(ended_pid()) == 1


def test_a_code_one_poller_got_is_not_lost_to_another_that_came_back_empty(monkeypatch):
    """Rank 0's log echo and the launcher's loop poll the same rank from two threads. The server's report goes
    to the first that asks; the other, still waiting for it, comes back with nothing. That must not erase the
    code: once it did (CI of 55ecd21), the job ended with returncodes [None, 0] and "the ranks did not finish"
    after the launcher's 5 s SIGTERM and 5 s SIGKILL waits on a rank that had completed."""
    monkeypatch.setattr(forked, "_LOST_CODE_WAIT_S", 0.5)
    process = subprocess.Popen(["sleep", "60"])
    try:
        server, pid = stand_in(process), ended_pid()
        rank = forked.ForkedRank(server, pid)
        waiting = threading.Thread(target=rank.poll)  # the echo: reaped, no report yet, so it waits for one
        waiting.start()
        threading.Event().wait(0.1)
        with server._changed:  # the report arrives and the loop's poll takes it before the echo wakes
            server._codes[pid] = 0
            assert rank.poll() == 0
        waiting.join()  # the echo's wait ends empty-handed (the report was taken)
        assert rank.poll() == 0 and rank.returncode == 0
    finally:
        process.kill()
        process.wait()
