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
