"""`python -m runner` with dp_replicate, end to end: FSDP and HSDP jobs of one sweep, their files and the analysis."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from helpers import run_module

STEPS = 3
FSDP_UNITS = 3  # tiny's two decoder layers and the root


def metrics(job: Path) -> list[dict]:
    return [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[Path, dict[int, Path]]:
    root = tmp_path_factory.mktemp("hsdp")
    args = [
        "-m",
        "reduction=sum",
        "dp_replicate=1,2",
        "world_size=4",
        "grad_accum=1",
        f"train.steps={STEPS}",
        "wandb.mode=disabled",
    ]
    done = run_module("runner", [*args, "hydra.sweep.dir=s"], root, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = {}
    for job in (root / "s").iterdir():
        if job.is_dir():
            jobs[json.loads((job / "summary.json").read_text())["dp_replicate"]] = job
    return root / "s", jobs


def test_the_hsdp_job_completes_and_names_its_layout(sweep):
    _, jobs = sweep
    summary = json.loads((jobs[2] / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_done"] == STEPS
    assert summary["layout"] == "DP(2x2)-SP(1)-GA(1)" and summary["dp"] == 4 and summary["world_size"] == 4
    assert json.loads((jobs[1] / "summary.json").read_text())["layout"] == "DP(4)-SP(1)-GA(1)"
    assert [r["step"] for r in metrics(jobs[2])] == list(range(1, STEPS + 1))


def test_hsdp_trains_as_fsdp_over_the_same_ranks(sweep):
    """Step 1 (same init, same tokens): the same loss, grad norm and sketch; the later steps follow."""
    _, jobs = sweep
    fsdp, hsdp = metrics(jobs[1]), metrics(jobs[2])
    for one, two in zip(fsdp, hsdp):
        assert two["tokens"] == one["tokens"]
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
        assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    assert hsdp[0]["grad_sketch"] == pytest.approx(fsdp[0]["grad_sketch"], rel=1e-4, abs=1e-7)


def test_the_replicas_all_reduce_is_counted_apart_from_the_losss(sweep):
    """The loss's all-reduces (`sum`: N, forward and backward) are the same; HSDP adds one all-reduce over the
    replicas per FSDP unit and micro-batch."""
    _, jobs = sweep
    fsdp, hsdp = metrics(jobs[1])[0], metrics(jobs[2])[0]
    assert hsdp["loss_comm"]["calls"] == fsdp["loss_comm"]["calls"] == 1 + 2
    assert hsdp["comm"]["replica_all_reduce"]["calls"] == FSDP_UNITS
    assert "replica_all_reduce" not in fsdp["comm"]
    assert hsdp["comm"]["reduce_scatter"]["calls"] == fsdp["comm"]["reduce_scatter"]["calls"] == FSDP_UNITS


def test_the_analysis_reads_dp_replicate_as_a_layout_axis(sweep):
    sweep_dir, _ = sweep
    done = run_module("analysis", [str(sweep_dir)], sweep_dir.parent, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(sweep_dir / "analysis" / "verdicts.csv") as f:
        verdicts = list(csv.DictReader(f))
    assert sorted(row["layout"] for row in verdicts) == ["DP(2x2)-SP(1)-GA(1)", "DP(4)-SP(1)-GA(1)"]
    assert len({row["family"] for row in verdicts}) == 1
    with open(sweep_dir / "analysis" / "invariance.csv") as f:
        (axis,) = [row for row in csv.DictReader(f) if row["axis"] == "dp_replicate"]
    assert axis["values"] == "1,2" and axis["changes"] == "False"
    assert "DP(2x2)-SP(1)-GA(1)" in (sweep_dir / "analysis" / "report.md").read_text()
