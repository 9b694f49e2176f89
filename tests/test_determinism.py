"""The same config twice gives bitwise-identical loss, grad_norm and grad_sketch sequences on CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FIELDS = ("loss", "reported_loss", "grad_norm", "grad_sketch", "valid_tokens")


@pytest.mark.parametrize("overrides", [["reduction=sum", "grad_accum=2"], ["reduction=local", "sp=2", "grad_accum=1"]])
def test_two_runs_of_one_config_are_bitwise_identical(tmp_path, overrides):
    runs = []
    for name in ("first", "second"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "runner",
                "world_size=2",
                "train.steps=6",
                "wandb.mode=disabled",
                *overrides,
                f"hydra.run.dir={name}",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        runs.append([{field: json.loads(line)[field] for field in FIELDS} for line in lines])
    first, second = runs
    assert len(first) == 6 and first[0]["grad_sketch"]  # the sketch is on by default
    assert first == second  # JSON floats round-trip exactly: equal text means equal bits
    assert first[0]["loss"] != first[-1]["loss"]  # and it trained


def _metrics(folder) -> list[dict]:
    return [
        {field: json.loads(line)[field] for field in FIELDS}
        for line in (folder / "metrics.jsonl").read_text().splitlines()
    ]


DROPOUT = ["model=hf_llama", "model.overrides.attention_dropout=0.1", "train.steps=3", "wandb.mode=disabled"]


@pytest.mark.slow
def test_dropout_is_seeded_per_step_and_rank(tmp_path):
    """Attention dropout 0.1 in a Hugging Face model: the same config in forked and in fresh ranks draws the same
    masks (bit-identical records); `sum`, `fsdp_sum` and `scaled` at one layout draw the same masks too, so their
    gradients agree and `--check` passes; and the masks are drawn at all (dropout 0 gives another loss)."""
    from tests.helpers import run_module

    sweep = run_module("runner", ["-m", *DROPOUT, "reduction=sum,fsdp_sum,scaled", "hydra.sweep.dir=sweep"], tmp_path)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    fresh_env = {**__import__("os").environ, "RUNNER_FORK_SERVER": "0"}
    fresh = run_module("runner", [*DROPOUT, "reduction=sum", "hydra.run.dir=fresh"], tmp_path, env=fresh_env)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    no_dropout = run_module(
        "runner", [*DROPOUT, "model.overrides.attention_dropout=0.0", "hydra.run.dir=none"], tmp_path
    )
    assert no_dropout.returncode == 0, no_dropout.stdout + no_dropout.stderr

    jobs = {json.loads((d / "summary.json").read_text())["reduction"]: d for d in (tmp_path / "sweep").glob("*_*")}
    assert set(jobs) == {"sum", "fsdp_sum", "scaled"}
    forked_sum = _metrics(jobs["sum"])
    assert forked_sum == _metrics(tmp_path / "fresh")  # forked and fresh ranks: the same draws, bit for bit
    assert [r["loss"] for r in forked_sum] != [r["loss"] for r in _metrics(tmp_path / "none")]  # dropout drew
    summary = json.loads((jobs["sum"] / "summary.json").read_text())
    assert summary["dropout"] == "attention_dropout=0.1"
    assert json.loads((tmp_path / "none" / "summary.json").read_text())["dropout"] is None

    checked = run_module("analysis", ["sweep", "--check", "--no-plots", "--wandb", "disabled"], tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = (tmp_path / "sweep" / "analysis" / "report.md").read_text()
    assert "3 runs trained with dropout: each is judged against the `sum` run of its own layout" in report
