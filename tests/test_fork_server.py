"""A rank forked from runner.world.fork_server is what `python -m MODULE ARGS` would have been.

Each test runs the same probe module both ways, through `runner.sweep.spawn.run_world`: as a fresh
interpreter (RUNNER_FORK_SERVER=0) and forked from the server, and compares what the probe saw.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.sweep import forked
from runner.sweep.spawn import run_world

PROBE = """
import json, os, sys, time
job_dir = sys.argv[1]
report = {
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "path": sys.path,
    "marker": os.environ.get("PROBE_MARKER"),
    "rank": os.environ.get("RANK"),
    "version": VERSION,
    "title": open(f"/proc/{os.getpid()}/cmdline").read().replace("\\0", " ").strip(),
    "torch_imported_before": "torch" in sys.modules,
}
with open(os.path.join(job_dir, f"probe{os.environ['RANK']}.json"), "w") as out:
    json.dump(report, out)
print("probe says hello", flush=True)
if os.environ.get("PROBE_SLEEP"):
    time.sleep(float(os.environ["PROBE_SLEEP"]))
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


def write_probe(folder: Path, version: int) -> None:
    (folder / "probe_rank.py").write_text(f"VERSION = {version}\n" + PROBE)


@pytest.fixture
def probe_env(tmp_path, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    write_probe(code, 1)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    monkeypatch.setenv("PROBE_MARKER", "seen")
    monkeypatch.chdir(tmp_path)
    return code


def run_probe(job_dir: Path, world_size: int = 2, fork: bool = True, monkeypatch=None):
    monkeypatch.setenv("RUNNER_FORK_SERVER", "1" if fork else "0")
    job_dir.mkdir()
    outcome = run_world(world_size, job_dir, ["--name", "n"], timeout_s=120, module="probe_rank")
    reports = [json.loads((job_dir / f"probe{rank}.json").read_text()) for rank in range(world_size)]
    return outcome, reports


def comparable(report: dict) -> dict:
    # --spawned-at differs between the two launches
    return {
        **report,
        "argv": report["argv"][:-1],
        "title": report["title"].rsplit(" ", 1)[0],
        "torch_imported_before": None,
    }


def test_a_forked_rank_sees_what_a_fresh_interpreter_sees(tmp_path, probe_env, monkeypatch):
    fresh, fresh_reports = run_probe(tmp_path / "fresh", fork=False, monkeypatch=monkeypatch)
    forked_outcome, forked_reports = run_probe(tmp_path / "forked", fork=True, monkeypatch=monkeypatch)
    assert fresh.returncodes == forked_outcome.returncodes == [0, 0]
    for rank, (a, b) in enumerate(zip(fresh_reports, forked_reports)):
        assert b["torch_imported_before"] and not a["torch_imported_before"]  # it was forked, from the server
        a_, b_ = comparable(a), comparable(b)
        for report, job in ((a_, "fresh"), (b_, "forked")):  # the job folder is the one argument that differs
            report["argv"] = [arg.replace(str(tmp_path / job), "JOB") for arg in report["argv"]]
            report["title"] = report["title"].replace(str(tmp_path / job), "JOB")
        assert a_ == b_, (rank, a_, b_)
        assert b["marker"] == "seen" and b["rank"] == str(rank)
        assert b["title"].startswith(f"{sys.executable} -m probe_rank ")  # ps and pkill -f see the rank as before
        assert (tmp_path / "forked" / "logs" / f"rank{rank}.log").read_text() == "probe says hello\n"


def test_a_changed_file_is_read_by_the_next_rank(tmp_path, probe_env, monkeypatch):
    _, first = run_probe(tmp_path / "one", world_size=1, monkeypatch=monkeypatch)
    write_probe(probe_env, 2)
    # An edit seconds later, as a person makes it: the byte-code cache goes by mtime and size, which a rewrite
    # within the same second to the same size would leave unchanged (for a fresh interpreter alike).
    later = time.time() + 5
    os.utime(probe_env / "probe_rank.py", (later, later))
    _, second = run_probe(tmp_path / "two", world_size=1, monkeypatch=monkeypatch)
    assert (first[0]["version"], second[0]["version"]) == (1, 2)


def test_exit_codes_and_signals_come_back_as_subprocess_gives_them(tmp_path, probe_env, monkeypatch):
    monkeypatch.setenv("PROBE_EXIT", "3")
    outcome, _ = run_probe(tmp_path / "three", world_size=1, monkeypatch=monkeypatch)
    assert outcome.returncodes == [3]
    monkeypatch.setenv("PROBE_EXIT", "0")
    monkeypatch.setenv("PROBE_SLEEP", "60")
    monkeypatch.setenv("RUNNER_FORK_SERVER", "1")
    job = tmp_path / "killed"
    (job / "logs").mkdir(parents=True)
    rank = forked.start_rank("probe_rank", [str(job)], dict(os.environ, RANK="0"), job / "logs" / "rank0.log")
    assert rank is not None
    deadline = time.time() + 60
    while not (job / "probe0.json").exists() and time.time() < deadline:
        time.sleep(0.05)
    rank.send_signal(signal.SIGTERM)
    while rank.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert rank.poll() == -signal.SIGTERM


def test_without_the_server_ranks_start_as_fresh_interpreters(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_FORK_SERVER", "0")
    assert forked.start_rank("probe_rank", [], dict(os.environ), tmp_path / "log") is None


def test_the_server_ends_with_its_launcher(tmp_path):
    script = (
        "import os, sys, time\n"
        "from runner.sweep import forked\n"
        "log = __import__('pathlib').Path(sys.argv[1])\n"
        "rank = forked.start_rank('this_module_does_not_exist', [], dict(os.environ), log)\n"
        "print(forked._server._process.pid, rank is not None, flush=True)\n"
        "while rank.poll() is None:\n"  # the rank has run (and failed) before the launcher goes
        "    time.sleep(0.05)\n"
        "os._exit(0)\n"  # no clean-up: the server must notice the closed pipe by itself
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "log")], capture_output=True, text=True, timeout=180
    )
    server_pid, was_forked = int(done.stdout.split()[0]), done.stdout.split()[1]
    assert was_forked == "True", done.stderr
    log = tmp_path / "log"
    deadline = time.time() + 60
    while (running(server_pid) or "No module named" not in log.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    assert not running(server_pid)
    assert "No module named this_module_does_not_exist" in log.read_text()


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_launcher_that_needs_no_rank_leaves_no_server_and_no_traceback(tmp_path):
    # a job skipped (completed earlier) after the server was started: the launcher ends while the server imports
    script = "import os\nfrom runner.sweep import forked\nprint(forked.prestart()._process.pid, flush=True)\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    server_pid = int(done.stdout.split()[0])
    deadline = time.time() + 60
    while running(server_pid) and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # whatever it would print on its way out
    assert not running(server_pid)
    assert "Traceback" not in done.stderr, done.stderr
