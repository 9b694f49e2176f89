"""End to end: a tensor-parallel sweep through `python -m runner` and `python -m analysis --check`.

A world_size=1 `sum` run (the ground truth) beside `sum`, `local` and `mean_of_means` at DP(2)-SP(1)-TP(2):
the analysis names the layout, counts W as the data ranks (world_size / tp = 2), expects and finds `local`
rescaled by 1/2 (not 1/4), `sum` the baseline's gradient, and counts tensor parallelism's collectives apart
from the loss's.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from helpers import run_module

STEPS = 3
TP_LAYOUT = "DP(2)-SP(1)-TP(2)-GA(2)"


def _rows(path: Path) -> dict[str, dict]:
    with path.open() as f:
        return {row["reduction"]: row for row in csv.DictReader(f) if row["layout"] == TP_LAYOUT}


@pytest.fixture(scope="module")
def analysed(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("tp")
    common = [f"train.steps={STEPS}", "wandb.mode=disabled"]
    one = run_module("runner", ["world_size=1", *common, f"hydra.run.dir={root / 'w1'}"], cwd=root)
    assert one.returncode == 0, one.stdout + one.stderr
    args = ["-m", "reduction=sum,local,mean_of_means", "world_size=4", "tp=2", *common]
    swept = run_module("runner", [*args, f"hydra.sweep.dir={root / 'tp'}"], cwd=root)
    assert swept.returncode == 0, swept.stdout + swept.stderr
    out = root / "analysis"
    check = run_module(
        "analysis",
        [str(root / "w1"), str(root / "tp"), "--check", "--out", str(out), "--wandb", "disabled", "--no-plots"],
        cwd=root,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    return out, check.stdout


def test_the_check_passes_with_local_rescaled_by_one_over_the_data_ranks(analysed):
    out, stdout = analysed
    assert "all 4 verdicts are as expected" in stdout, stdout
    rows = _rows(out / "verdicts.csv")
    assert set(rows) == {"sum", "local", "mean_of_means"}
    assert {row["tp"] for row in rows.values()} == {"2"} and {row["data_ranks"] for row in rows.values()} == {"2.0"}
    assert rows["sum"]["verdict"] == "equivalent" and float(rows["sum"]["factor"]) == pytest.approx(1, rel=1e-5)
    assert rows["local"]["expected"] == "rescaled ×1/2" and rows["local"]["verdict"] == "rescaled"
    assert float(rows["local"]["factor"]) == pytest.approx(0.5, rel=1e-5)
    assert rows["mean_of_means"]["verdict"] == "different"  # padded documents: the micro-batches' counts differ


def test_the_report_says_what_w_counts_under_tensor_parallelism(analysed):
    out, _ = analysed
    report = (out / "report.md").read_text()
    assert f"layouts DP(1)-SP(1)-GA(2), {TP_LAYOUT}" in report
    assert "W below counts the data ranks, world_size / tp" in report
    assert "×1/2 at W=2" in report  # local's factor, at the 2 data ranks of the 4 processes


def test_tp_collectives_are_counted_apart_from_the_loss_all_reduces(analysed):
    out, _ = analysed
    rows = _rows(out / "comm.csv")
    # local: N and the logged loss, as without tp; sum: N and a forward and a backward all-reduce per
    # micro-batch (GA 2), whose forward values are the logged loss
    assert float(rows["local"]["loss_all_reduce_calls"]) == 2
    assert float(rows["sum"]["loss_all_reduce_calls"]) == 1 + 2 * 2
    summary = json.loads(next((out.parent / "tp").glob("*reduction=local*/summary.json")).read_text())
    assert (summary["tp"], summary["dp"], summary["layout"]) == (2, 2, TP_LAYOUT)
    steps = [json.loads(line) for line in next((out.parent / "tp").glob("*reduction=local*/metrics.jsonl")).open()]
    sampled = [row["comm"] for row in steps if row.get("comm")]
    assert sampled and all(c["tp_all_gather"]["calls"] > 0 and c["tp_reduce_scatter"]["calls"] > 0 for c in sampled)
