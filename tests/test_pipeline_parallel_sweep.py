"""End to end: a pipeline-parallel sweep through `python -m runner` and `python -m analysis --check`.

A world_size=1 `sum` run (the ground truth) beside `sum`, `local` and `fsdp_sum` at DP(2)-SP(1)-PP(2), under
GPipe and 1F1B: the analysis names the layout, counts W as the data ranks (world_size / pp = 2), expects and
finds `local` rescaled by 1/2 (not 1/4) and `sum` and `fsdp_sum` the baseline's gradient under both schedules
(one family: the schedule changes how the step is computed, not what it should be), and counts the stages'
sends and receives apart from the loss's collectives.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from helpers import run_module

STEPS = 3
PP_LAYOUT = "DP(2)-SP(1)-PP(2)-GA(2)"


def _rows(path: Path) -> list[dict]:
    with path.open() as f:
        return [row for row in csv.DictReader(f) if row["layout"] == PP_LAYOUT]


@pytest.fixture(scope="module")
def analysed(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("pp")
    common = [f"train.steps={STEPS}", "wandb.mode=disabled"]
    one = run_module("runner", ["world_size=1", *common, f"hydra.run.dir={root / 'w1'}"], cwd=root)
    assert one.returncode == 0, one.stdout + one.stderr
    args = ["-m", "reduction=sum,local,fsdp_sum", "world_size=4", "pp=2", "pp_schedule=gpipe,one_f_one_b", *common]
    swept = run_module("runner", [*args, f"hydra.sweep.dir={root / 'pp'}"], cwd=root)
    assert swept.returncode == 0, swept.stdout + swept.stderr
    out = root / "analysis"
    check = run_module(
        "analysis",
        [str(root / "w1"), str(root / "pp"), "--check", "--out", str(out), "--wandb", "disabled", "--no-plots"],
        cwd=root,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    return out, check.stdout


def test_the_check_passes_with_local_rescaled_by_one_over_the_data_ranks_under_both_schedules(analysed):
    out, stdout = analysed
    assert "all 7 verdicts are as expected" in stdout, stdout
    rows = _rows(out / "verdicts.csv")
    by = {(row["reduction"], row["pp_schedule"]): row for row in rows}
    assert set(by) == {
        (mode, schedule) for mode in ("sum", "local", "fsdp_sum") for schedule in ("gpipe", "one_f_one_b")
    }
    for (mode, _), row in by.items():
        assert (row["pp"], row["data_ranks"]) == ("2", "2.0")
        if mode == "local":
            assert row["expected"] == "rescaled ×1/2" and row["verdict"] == "rescaled"
            assert float(row["factor"]) == pytest.approx(0.5, rel=1e-5)
        else:
            assert row["verdict"] == "equivalent" and float(row["factor"]) == pytest.approx(1, rel=1e-5)


def test_the_report_says_what_w_counts_under_pipeline_parallelism(analysed):
    out, _ = analysed
    report = (out / "report.md").read_text()
    assert PP_LAYOUT in report
    assert "W below counts the data ranks, world_size / pp: the pp stages of a pipeline" in report
    assert "×1/2 at W=2" in report


def test_pp_sends_are_counted_apart_from_the_loss_all_reduces(analysed):
    out, _ = analysed
    rows = {(row["reduction"], row["pp_schedule"]): row for row in _rows(out / "comm.csv")}
    # The last stage's, where the loss is: N and local's logged loss; sum's forward and backward per pipeline
    # micro-batch (K = 2) of each micro-batch (GA 2), K times as many as without pp.
    for schedule in ("gpipe", "one_f_one_b"):
        assert float(rows["local", schedule]["loss_all_reduce_calls"]) == 2
        assert float(rows["sum", schedule]["loss_all_reduce_calls"]) == 1 + 2 * 2 * 2
    folder = next((out.parent / "pp").glob("*pp_schedule=gpipe,reduction=local*"))
    summary = json.loads((folder / "summary.json").read_text())
    assert (summary["pp"], summary["dp"], summary["layout"]) == (2, 2, PP_LAYOUT)
    steps = [json.loads(line) for line in (folder / "metrics.jsonl").open()]
    sampled = [row["comm"] for row in steps if row.get("comm")]
    # 2 micro-batches x 2 pipeline micro-batches: 4 activations sent per step from stage 0
    assert sampled and all(c["pp_send"]["calls"] >= 4 and c["pp_recv"]["calls"] >= 4 for c in sampled), sampled
