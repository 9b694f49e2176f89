"""End to end: `python -m runner` sweeps in subprocesses, read back from the files they leave.

One module-scoped sweep of three modes backs most assertions; the other
tests cover a failed job amid good ones, invalid input, timeouts and torchrun.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cli_verdict

SECRET = "local-5ec7e7-0123456789abcdef0123456789abcdef01"
GRAD_ACCUM = 2  # set by the default experiment
STEPS = 5
WANDB_EVERY = 2  # W&B charts steps 1, 2, 4 and 5 of 5


def run_runner(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-m", "runner", *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=600
    )


def metrics(job: Path) -> list[dict]:
    return [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]


def summary(job: Path) -> dict:
    return json.loads((job / "summary.json").read_text())


SWEEP_ARGS = [
    "-m",
    "reduction=sum,local,detached",
    "world_size=2",
    f"train.steps={STEPS}",
    f"wandb.log_every={WANDB_EVERY}",
]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    sweep_dir = root / "sweep"
    done = run_runner([*SWEEP_ARGS, f"hydra.sweep.dir={sweep_dir}"], cwd=root, WANDB_API_KEY=SECRET)
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = {summary(job)["reduction"]: job for job in sorted(sweep_dir.iterdir()) if job.is_dir()}
    return sweep_dir, jobs, done.stdout + done.stderr


def test_three_completed_jobs_with_the_contracted_files(sweep):
    _, jobs, _ = sweep
    assert sorted(jobs) == ["detached", "local", "sum"]
    for job in jobs.values():
        info = summary(job)
        assert info["status"] == "completed" and info["error"] is None and info["steps_done"] == STEPS
        assert set(info["wall_s"]) == {"launch", "init", "train", "teardown"}
        assert info["versions"]["torch"].startswith("2.") and info["backend"] == "gloo"
        assert (job / "config.yaml").read_text().startswith("reduction:")
        records = metrics(job)
        assert [r["step"] for r in records] == list(range(1, STEPS + 1))
        assert all(r["tokens"] == sum(q["valid_tokens"] for q in records[: i + 1]) for i, r in enumerate(records))
        for field in ("loss", "grad_norm", "clip_coef", "lr", "step_time_s"):
            assert all(isinstance(r[field], float) for r in records), field
        assert all(len(r["grad_sketch"]) == 8 for r in records)
        assert list(job.glob("wandb/offline-run-*/run-*.wandb"))


def test_modes_agree_at_step_one_up_to_their_gradient_factor(sweep):
    _, jobs, _ = sweep
    first = {mode: metrics(job)[0] for mode, job in jobs.items()}
    for mode in ("local", "detached"):
        assert first[mode]["loss"] == pytest.approx(first["sum"]["loss"], rel=1e-6)
        # W = 2: the local-loss gradient is half the global one, and so is every projection of it.
        assert first[mode]["grad_norm"] == pytest.approx(first["sum"]["grad_norm"] / 2, rel=1e-5)
        for got, want in zip(first[mode]["grad_sketch"], first["sum"]["grad_sketch"]):
            assert got == pytest.approx(want / 2, rel=1e-4, abs=1e-6)


def test_communication_differs_by_the_modes_loss_collectives(sweep):
    _, jobs, _ = sweep
    calls = {mode: metrics(job)[-1]["comm"] for mode, job in jobs.items()}
    all_reduces = {mode: c["all_reduce"]["calls"] for mode, c in calls.items()}
    # sum: forward + backward per micro-batch; detached: one per micro-batch; local: one per step.
    assert all_reduces["sum"] - all_reduces["local"] == 2 * GRAD_ACCUM - 1
    assert all_reduces["detached"] - all_reduces["local"] == GRAD_ACCUM - 1
    # loss_comm: the all-reduces of forward/backward: N, plus the mode's own loss collectives
    # (sum: 2 per micro-batch; detached: 1 per micro-batch; local: 1 per step, for logging).
    loss_calls = {mode: metrics(job)[-1]["loss_comm"]["calls"] for mode, job in jobs.items()}
    assert loss_calls == {"sum": 1 + 2 * GRAD_ACCUM, "local": 1 + 1, "detached": 1 + GRAD_ACCUM}
    for mode in jobs:  # the rest (grad norm, in the optimizer phase) is the same for every mode
        assert all_reduces[mode] - loss_calls[mode] == all_reduces["local"] - loss_calls["local"] > 0
    for kind in ("all_gather", "reduce_scatter"):  # FSDP's own traffic does not depend on the mode
        assert calls["sum"][kind]["calls"] == calls["local"][kind]["calls"] > 0
        assert calls["sum"][kind]["bytes"] == calls["local"][kind]["bytes"] > 0


def test_offline_wandb_run_holds_the_loss_history(sweep):
    sweep_dir, jobs, _ = sweep
    wandb = shutil.which("wandb", path=str(Path(sys.executable).parent))
    for mode, job in jobs.items():
        run_dir = next(job.glob("wandb/offline-run-*"))
        out = subprocess.run(
            [wandb, "leet", "inspect", "--json", str(run_dir)], capture_output=True, text=True, check=True
        )
        records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        history = [r["history"]["item"] for r in records if r["type"] == "history"]
        charted = [m for m in metrics(job) if m["step"] in (1, *range(WANDB_EVERY, STEPS + 1, WANDB_EVERY), STEPS)]
        assert [m["step"] for m in charted] == [1, 2, 4, 5]
        assert [h["loss"] for h in history] == pytest.approx([m["loss"] for m in charted], rel=1e-9)
        assert [h["tokens"] for h in history] == [m["tokens"] for m in charted]
        assert [h["step_time_s"] for h in history] == pytest.approx([m["step_time_s"] for m in charted], rel=1e-9)
        assert not any("grad_sketch/0" in h or "dp" in h for h in history)  # metrics.jsonl keeps what no chart shows
        run = next(r["run"] for r in records if r["type"] == "run")
        assert run["run_group"] == sweep_dir.name and run["job_type"] == mode


def test_sequence_parallel_training_tracks_sp1(tmp_path):
    """A few steps at sp=2 follow sp=1 (same W, same tokens) to within 1e-5 relative."""
    done = run_runner(
        ["-m", "reduction=sum", "world_size=2", "sp=1,2", "train.steps=8", "wandb.mode=disabled", "hydra.sweep.dir=s"],
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    runs = {summary(job)["sp"]: job for job in (tmp_path / "s").iterdir() if job.is_dir()}
    assert summary(runs[2])["layout"] == "DP(1)-SP(2)-GA(2)"
    plain, sharded = metrics(runs[1]), metrics(runs[2])
    assert [r["sp"] for r in sharded] == [2] * 8 and [r["dp"] for r in sharded] == [1] * 8
    for one, two in zip(plain, sharded):
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
        assert two["tokens"] == one["tokens"]
    # Two all-to-alls per layer per micro-batch in forward, two more in backward.
    assert sharded[-1]["comm"]["all_to_all"]["calls"] == 2 * 2 * 2 * GRAD_ACCUM
    assert "all_to_all" not in plain[-1]["comm"]


def test_api_key_never_lands_in_a_file(sweep, tmp_path):
    """Ran with WANDB_API_KEY set: no config, summary, metrics, log, W&B offline file or report holds it."""
    sweep_dir, _, output = sweep
    assert SECRET not in output
    copy = shutil.copytree(sweep_dir, tmp_path / "sweep")  # the analysis writes into the copy
    analysis = subprocess.run(
        [sys.executable, "-m", "analysis", str(copy)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "WANDB_API_KEY": SECRET},
    )
    assert analysis.returncode == 0, analysis.stdout + analysis.stderr
    assert SECRET not in analysis.stdout + analysis.stderr
    written = [path for path in copy.rglob("*") if path.is_file()]
    kinds = {path.name for path in written}
    assert {"config.yaml", "summary.json", "metrics.jsonl", "rank1.log", "report.md"} <= kinds
    assert any(path.suffix == ".wandb" for path in written)  # the W&B offline run files were scanned too
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), path


def test_rerun_into_the_same_sweep_keeps_completed_jobs(sweep):
    sweep_dir, jobs, _ = sweep
    before = {mode: (job / "metrics.jsonl").read_bytes() for mode, job in jobs.items()}
    done = run_runner([*SWEEP_ARGS, f"hydra.sweep.dir={sweep_dir}"], cwd=sweep_dir.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (done.stdout + done.stderr).count("skipped, completed earlier") == 3
    assert {mode: (job / "metrics.jsonl").read_bytes() for mode, job in jobs.items()} == before


def test_failed_and_invalid_jobs_do_not_stop_the_sweep(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("\n\n".join(f"Paragraph number {i} of a small corpus." for i in range(50)))
    done = run_runner(
        [
            "-m",
            "reduction=sum",
            f"data.path={good}",
            "fault.kind=none,raise",
            "grad_accum=1,3",
            "train.steps=2",
            "wandb.mode=disabled",
            "hydra.sweep.dir=s",
        ],
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # a job failed: the sweep says so
    assert "2 of 4 jobs are invalid" in done.stdout + done.stderr
    assert "sweep: completed 1, failed 1, diverged 0, invalid 2, skipped 0" in done.stdout + done.stderr
    outcomes = {}
    for job in (tmp_path / "s").iterdir():
        if job.is_dir():
            config = (job / "config.yaml").read_text()
            outcomes[("raise" if "kind: raise" in config else "none", "grad_accum: 3" in config)] = summary(job)
    assert outcomes[("none", False)]["status"] == "completed", outcomes[("none", False)]
    assert outcomes[("raise", False)]["status"] == "failed"
    assert "fault.kind=raise injected on rank 0 at step 1" in outcomes[("raise", False)]["error"]
    for fault in ("none", "raise"):
        invalid = outcomes[(fault, True)]
        assert invalid["status"] == "invalid" and invalid["problems"] == ["train.global_batch"]
    assert not list((tmp_path / "s").glob("*grad_accum=3*/logs"))  # no rank was started


def test_invalid_single_run_fails_before_any_rank_starts():
    verdict = cli_verdict(["sp=3"])  # the CLI's steps before any rank, in-process (tests/test_refusals.py launches it)
    assert verdict.code == 2
    assert "sp=3 does not divide world_size=2; valid sp: 1, 2" in verdict.message
    assert verdict.status == "invalid"


def test_sweep_with_no_valid_job_stops_before_launching(tmp_path):
    done = run_runner(["-m", "grad_accum=3,5", "hydra.sweep.dir=s"], cwd=tmp_path)
    assert done.returncode == 2
    assert "train.global_batch=16 cannot be split evenly" in done.stdout + done.stderr
    assert not any(p.is_dir() for p in (tmp_path / "s").glob("*"))


def test_a_job_past_its_timeout_is_stopped_and_recorded(tmp_path):
    done = run_runner(["train.steps=100000", "timeout_s=15", "wandb.mode=disabled", "hydra.run.dir=run"], cwd=tmp_path)
    assert done.returncode == 1  # recorded, and the run says so
    info = summary(tmp_path / "run")
    assert info["status"] == "failed" and "timed out after timeout_s=15" in info["error"]
    assert len(metrics(tmp_path / "run")) > 0  # what was logged before the stop is kept


def test_divergence_is_detected_and_recorded(tmp_path):
    done = run_runner(
        ["optim=sgd", "optim.lr=1e5", "train.steps=50", "wandb.mode=disabled", "hydra.run.dir=run"], cwd=tmp_path
    )
    assert done.returncode == 1, done.stdout + done.stderr  # an unexpected divergence, like a failure
    info, records = summary(tmp_path / "run"), metrics(tmp_path / "run")
    assert info["status"] == "diverged" and "not finite at step" in info["error"]
    assert info["steps_done"] == len(records) < 50
    assert records[-1]["loss"] is None or records[-1]["grad_norm"] is None  # written as JSON null


def test_joins_a_torchrun_world_instead_of_spawning(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    done = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "runner",
            "train.steps=3",
            "wandb.mode=disabled",
            "hydra.run.dir=run",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    info = summary(tmp_path / "run")
    assert info["status"] == "completed" and info["steps_done"] == 3
    assert info["wall_s"]["launch"] is None  # torchrun launched it, not us
    assert not (tmp_path / "run" / "logs").exists()  # nothing was spawned
    assert "run DP(2)-SP(1)-GA(2)" in done.stdout + done.stderr and "completed in" in done.stdout + done.stderr
    assert "completed in" in (tmp_path / "run" / "runner.log").read_text()  # the job's log holds its outcome


def test_analysis_of_a_real_sweep_passes_check_and_catches_a_corrupted_run(sweep, tmp_path):
    sweep_dir, _, _ = sweep
    copy = shutil.copytree(sweep_dir, tmp_path / "sweep", ignore=shutil.ignore_patterns("wandb", "analysis"))
    analyze = [sys.executable, "-m", "analysis", str(copy), "--check"]
    done = subprocess.run(analyze, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "check: all 3 verdicts are as expected" in done.stdout
    verdicts = {row["reduction"]: row for row in csv.DictReader((copy / "analysis" / "verdicts.csv").open())}
    assert verdicts["local"]["verdict_text"] == verdicts["detached"]["verdict_text"] == "rescaled ×1/2"
    assert float(verdicts["local"]["factor"]) == pytest.approx(0.5, rel=1e-5)
    comm = {row["reduction"]: row for row in csv.DictReader((copy / "analysis" / "comm.csv").open())}
    assert float(comm["sum"]["extra_loss_calls_vs_local"]) == 2 * GRAD_ACCUM - 1
    # The runs logged to offline W&B, so the analysis does too, into its own run of the sweep's group.
    (run_dir,) = (copy / "analysis" / "wandb").glob("offline-run-*")
    wandb = shutil.which("wandb", path=str(Path(sys.executable).parent))
    out = subprocess.run([wandb, "leet", "inspect", "--json", str(run_dir)], capture_output=True, text=True, check=True)
    records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    (logged,) = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert int(logged["verdicts.nrows"]) == 3 and logged["plots/loss_curves._type"] == "image-file"
    assert [r["run"]["job_type"] for r in records if r["type"] == "run"] == ["analysis"]

    # A local run whose gradient sketch claims the full gradient no longer passes as 1/W.
    local = next(job for job in copy.iterdir() if "reduction=local" in job.name)
    records = metrics(local)
    for record in records:
        record["grad_sketch"] = [2 * value for value in record["grad_sketch"]]
    (local / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    done = subprocess.run([*analyze, "--wandb", "disabled"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "check FAILED: 1 verdict(s)" in done.stdout and "reduction=local" in done.stdout.split("check FAILED")[1]


def make_sync(sweep_dir: Path, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`make sync` of this repository with the running interpreter's venv (setup is not redone)."""
    environ = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"} | {"HOME": str(home), **env}
    repo, venv = Path(__file__).parents[1], Path(sys.executable).parents[1]
    command = ["make", "-s", "-C", str(repo), "-o", "setup", "sync", f"VENV={venv}", f"SWEEP={sweep_dir}", *args]
    return subprocess.run(command, env=environ, capture_output=True, text=True, timeout=300)


def test_make_sync_lists_every_offline_run_and_needs_a_key(sweep, tmp_path):
    sweep_dir, jobs, _ = sweep
    refused = make_sync(sweep_dir, tmp_path)
    assert refused.returncode != 0 and "set WANDB_API_KEY" in refused.stdout + refused.stderr
    dry = make_sync(sweep_dir, tmp_path, "DRY_RUN=1")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    runs = sorted(str(p) for job in jobs.values() for p in (job / "wandb").glob("offline-run-*"))
    assert len(runs) == len(jobs) and f"sync: {len(runs)} runs from {sweep_dir}" in dry.stdout
    assert all(Path(run).name in dry.stdout + dry.stderr for run in runs), dry.stdout + dry.stderr
    # An attempt killed before W&B wrote its log leaves a header-only .wandb file (7 bytes): no run record to
    # sync, and wandb sync would fail on it; it is left out, and said so.
    killed = Path(runs[0]).parent / "offline-run-20000101_000000-killedattempt"
    killed.mkdir()
    (killed / "run-killedattempt.wandb").write_bytes(Path(next(Path(runs[0]).glob("run-*.wandb"))).read_bytes()[:7])
    dry = make_sync(sweep_dir, tmp_path, "DRY_RUN=1")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "1 run folder(s) left out: no run record" in dry.stdout
    assert f"sync: {len(runs)} runs from {sweep_dir}" in dry.stdout and "killedattempt" not in dry.stdout + dry.stderr
