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
import threading
import time
from pathlib import Path

import pytest

from runner.sweep import forked
from runner.sweep.spawn import run_world
from runner.world import import_env

PROBE = """
import json, os, sys, time
job_dir = sys.argv[1]
torch_imported_before = "torch" in sys.modules
if os.environ.get("PROBE_IMPORT"):
    import numpy, torch
def running(pid):  # ended and not yet reaped counts as ended
    return os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX"
claims = os.path.join(job_dir, f"claims{os.environ['RANK']}")  # every process that ran as this rank
earlier = [int(pid) for pid in open(claims).read().split()] if os.path.exists(claims) else []
with open(claims, "a") as out:
    out.write(f"{os.getpid()}\\n")
report = {
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "path": sys.path,
    "marker": os.environ.get("PROBE_MARKER"),
    "rank": os.environ.get("RANK"),
    "version": VERSION,
    "title": open(f"/proc/{os.getpid()}/cmdline").read().replace("\\0", " ").strip(),
    "torch_imported_before": torch_imported_before,
    "environ": dict(e.split("=", 1) for e in open(f"/proc/{os.getpid()}/environ").read().split("\\0") if "=" in e),
    "pid": os.getpid(),
    "threads": len(os.listdir("/proc/self/task")),
    "torch_threads": torch.get_num_threads() if os.environ.get("PROBE_IMPORT") else None,
    "hash": hash("probe"),
    "earlier_running": [pid for pid in earlier if running(pid)],
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
    monkeypatch.setenv("RUNNER_FORK_SERVER", "1")
    monkeypatch.chdir(tmp_path)
    return code


def run_probe(job_dir: Path, world_size: int = 2, fork: bool = True, monkeypatch=None):
    monkeypatch.setenv("RUNNER_FORK_SERVER", "1" if fork else "0")
    job_dir.mkdir()
    outcome = run_world(world_size, job_dir, ["--name", "n"], timeout_s=120, module="probe_rank")
    reports = [json.loads((job_dir / f"probe{rank}.json").read_text()) for rank in range(world_size)]
    return outcome, reports


def comparable(report: dict) -> dict:
    # Differ: --spawned-at, the rendezvous folder, RUNNER_FORK_SERVER; the pid, the hash seed (where not set); the
    # threads unless the probe imported numpy and torch (a forked rank has the preload's, and their BLAS threads)
    environ = {k: v for k, v in report["environ"].items() if k not in ("RUNNER_RENDEZVOUS_FILE", "RUNNER_FORK_SERVER")}
    return {
        **report,
        "argv": report["argv"][:-1],
        "title": report["title"].rsplit(" ", 1)[0],
        "torch_imported_before": None,
        "environ": environ,
        "pid": None,
        "hash": None,
        "threads": report["threads"] if report["torch_threads"] is not None else None,
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
    job = tmp_path / "killed"
    (job / "logs").mkdir(parents=True)
    rank = forked.start_rank("probe_rank", [str(job)], dict(os.environ, RANK="0"), job / "logs" / "rank0.log")
    assert rank is not None
    wait_until(lambda: (job / "probe0.json").exists())
    rank.send_signal(signal.SIGTERM)
    wait_until(lambda: rank.poll() is not None)
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
    wait_until(lambda: not running(server_pid) and "No module named" in log.read_text())
    assert not running(server_pid)
    assert "No module named this_module_does_not_exist" in log.read_text()


def wait_until(done, timeout_s: float = 60) -> bool:
    deadline = time.time() + timeout_s
    while not done() and time.time() < deadline:
        time.sleep(0.02)
    return done()


running = forked._running


def test_a_launcher_that_needs_no_rank_leaves_no_server_and_no_traceback(tmp_path):
    # a job skipped (completed earlier) after the server was started: the launcher ends while the server imports
    script = "import os\nfrom runner.sweep import forked\nprint(forked.prestart()._process.pid, flush=True)\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    server_pid = int(done.stdout.split()[0])
    wait_until(lambda: not running(server_pid))
    time.sleep(0.5)  # whatever it would print on its way out
    assert not running(server_pid)
    assert "Traceback" not in done.stderr, done.stderr


def ready_server(server=None):
    """The launcher's server (or `server`), its preload done and no child of an earlier test left to report."""
    server = server or forked.prestart()
    with server._changed:
        server._changed.wait_for(lambda: server._ready, 180)
    wait_until(lambda: not forked._children_of(server._process.pid))
    return server


def inject(server, data: bytes) -> None:
    """Write `data` into the pipe the server replies on, as a stray print of the server would."""
    pipe = f"pipe:[{os.fstat(server._process.stdout.fileno()).st_ino}]"
    fd = next(f for f in Path(f"/proc/{server._process.pid}/fd").iterdir() if os.readlink(f) == pipe)
    with open(fd, "wb", buffering=0) as out:
        out.write(data)


def test_a_stray_line_on_the_reply_pipe_is_noted_and_skipped(tmp_path, probe_env, monkeypatch, capfd):
    server = ready_server()
    inject(server, b"not a reply\n[1, 2]\n")
    outcome, reports = run_probe(tmp_path / "after", monkeypatch=monkeypatch)
    assert outcome.returncodes == [0, 0] and outcome.wall_s < forked._REPLY_TIMEOUT_S
    assert all(report["torch_imported_before"] for report in reports)  # forked, by that same server
    assert forked._server is server and server.alive()
    assert capfd.readouterr().err.count("not a reply, skipped") == 2


def test_an_unanswered_request_has_its_child_killed_before_the_rank_starts_afresh(tmp_path, probe_env, monkeypatch):
    monkeypatch.setenv("PROBE_SLEEP", "4")  # longer than the wait for the reply
    monkeypatch.setattr(forked, "_REPLY_TIMEOUT_S", 2.0)
    server = ready_server()
    inject(server, b'{"lost": ')  # the server's next reply, the pid forked for the request, joins this line
    outcome, [report] = run_probe(tmp_path / "lost", world_size=1, monkeypatch=monkeypatch)
    first, second = map(int, (tmp_path / "lost" / "claims0").read_text().split())
    assert outcome.returncodes == [0] and report["pid"] == second and not report["torch_imported_before"]
    assert report["earlier_running"] == []  # the forked one was gone before the fresh one started
    assert not running(first) and forked._server is server and server.alive()


def test_a_server_deaf_to_a_cancel_is_killed_with_its_children_and_retired(tmp_path, probe_env, monkeypatch):
    monkeypatch.setattr(forked, "_REPLY_TIMEOUT_S", 2.0)
    monkeypatch.setattr(forked, "_CANCEL_TIMEOUT_S", 2.0)
    server = ready_server(forked.ForkServer())
    inject(server, b'{"lost": ')
    claimed = tmp_path / "claims0"  # once its child runs, the server answers nothing
    threading.Thread(target=lambda: wait_until(claimed.exists) and os.kill(server._process.pid, signal.SIGSTOP)).start()
    env = dict(os.environ, RANK="0", PROBE_SLEEP="60")
    assert server.start("probe_rank", [str(tmp_path)], env, tmp_path / "log") is None
    [child] = map(int, (tmp_path / "claims0").read_text().split())
    assert not running(child) and server._process.poll() == -signal.SIGKILL and server.retired
    assert server.start("probe_rank", [str(tmp_path)], env, tmp_path / "log") is None


def test_the_server_forks_with_one_thread_and_a_rank_has_the_threads_of_a_fresh_one(tmp_path, probe_env, monkeypatch):
    monkeypatch.setenv("PROBE_IMPORT", "1")  # numpy and torch, with their thread pools
    server = ready_server(forked.ForkServer())  # before its first fork (whose preparation ends BLAS threads)
    threads = len(os.listdir(f"/proc/{server._process.pid}/task"))
    server.close()
    assert threads == 1
    _, [fresh] = run_probe(tmp_path / "fresh", world_size=1, fork=False, monkeypatch=monkeypatch)
    _, [child] = run_probe(tmp_path / "forked", world_size=1, fork=True, monkeypatch=monkeypatch)
    assert child["torch_imported_before"] and not fresh["torch_imported_before"]
    assert (child["threads"], child["torch_threads"]) == (fresh["threads"], fresh["torch_threads"])


def test_a_rank_whose_import_time_environment_differs_from_the_servers_starts_afresh(tmp_path, probe_env):
    log, base = tmp_path / "log", dict(ready_server().env, RANK="0")
    for name in [prefix + "RUNNER_PROBE" for prefix in import_env.PREFIXES] + sorted(import_env.NAMES):
        assert forked.start_rank("probe_rank", [str(tmp_path)], {**base, name: "changed"}, log) is None, name
    for name in [name for name in base if import_env.read_at_import(name)]:
        assert (
            forked.start_rank("probe_rank", [str(tmp_path)], {k: v for k, v in base.items() if k != name}, log) is None
        )
    # what the child makes of itself, and what nothing reads at import, may differ
    path = os.pathsep.join([base["PYTHONPATH"], str(tmp_path)])
    same = {**base, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1", "PROBE_MARKER": "x"}
    rank = forked.start_rank("probe_rank", [str(tmp_path)], same, log)
    assert wait_until(lambda: rank.poll() is not None) and rank.poll() == 0


def test_omp_threads_and_hash_seed_set_after_the_server_started_are_honoured(tmp_path, probe_env, monkeypatch):
    ready_server()  # started before, as for a sweep's earlier job
    for name, value in (("PROBE_IMPORT", "1"), ("OMP_NUM_THREADS", "1"), ("PYTHONHASHSEED", "123")):
        monkeypatch.setenv(name, value)
    _, [report] = run_probe(tmp_path / "seeded", world_size=1, monkeypatch=monkeypatch)
    seeded = subprocess.run([sys.executable, "-c", "print(hash('probe'))"], capture_output=True, text=True, check=True)
    assert not report["torch_imported_before"] and report["torch_threads"] == 1
    assert report["hash"] == int(seeded.stdout)


def test_every_variable_the_preload_reads_counts_as_read_at_import():
    command = [sys.executable, "-m", "runner.world.import_env"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    count, *missed = done.stdout.split()
    assert int(count) > 20 and missed == []  # torch alone reads dozens


def test_a_forked_ranks_proc_environ_and_cmdline_are_its_own(tmp_path, probe_env):
    env, argv = dict(ready_server().env, RANK="3", WORLD_SIZE="4", PROBE_SLEEP="60"), [str(tmp_path), "an argument"]
    rank = forked.start_rank("probe_rank", argv, env, tmp_path / "log")
    wait_until(lambda: (tmp_path / "probe3.json").exists())
    environ = Path(f"/proc/{rank.pid}/environ").read_bytes().split(b"\0")[:-1]
    assert dict(entry.decode().split("=", 1) for entry in environ) == env  # what ps e shows
    expected = [sys.executable, "-m", "probe_rank", *argv]
    assert Path(f"/proc/{rank.pid}/cmdline").read_bytes() == b"".join(os.fsencode(a) + b"\0" for a in expected)
    rank.send_signal(signal.SIGKILL)
    wait_until(lambda: rank.poll() is not None)


THREAD_PROBE = """
import threading
from runner.world import proc_identity
for _ in range(50):  # joined threads: the kernel may list each a moment longer; none may be counted
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    assert proc_identity.other_threads() == [], proc_identity.other_threads()
release = threading.Event()
alive = threading.Thread(target=release.wait)
alive.start()
print(len(proc_identity.other_threads(settle_s=0.05)))
release.set()
"""


def test_a_thread_that_ended_is_not_counted_and_one_alive_is_named():
    # In a process of one thread, as the server is after its preload (pytest's own has others).
    done = subprocess.run([sys.executable, "-c", THREAD_PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"], done.stdout
