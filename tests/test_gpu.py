"""The GPU path (NCCL, bf16 mixed precision): run by bench/gpu_smoke.sh, skipped without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
QUICK = ["train.steps=3", "wandb.mode=disabled", "grad_accum=2"]


def run(tmp_path: Path, name: str, *overrides: str) -> tuple[dict, list[dict]]:
    done = subprocess.run(
        [sys.executable, "-m", "runner", *QUICK, *overrides, f"hydra.run.dir={name}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job = tmp_path / name
    records = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    return json.loads((job / "summary.json").read_text()), records


@pytest.mark.parametrize("model", ["tiny", "hf_llama"])
def test_cuda_bf16_run_matches_the_cpu_fp32_run_at_step_one(tmp_path, model):
    bf16 = ["mp.param_dtype=bfloat16", "mp.reduce_dtype=bfloat16"]
    gpu, gpu_records = run(tmp_path, "gpu", f"model={model}", "device=cuda", "world_size=1", *bf16)
    cpu, cpu_records = run(tmp_path, "cpu", f"model={model}", "device=cpu", "world_size=1")
    assert gpu["status"] == "completed" and gpu["backend"] == "nccl" and cpu["backend"] == "gloo"
    # The same weights and tokens; bf16 compute moves the loss of a ~5.5-nat model by far less than 0.05.
    assert abs(gpu_records[0]["loss"] - cpu_records[0]["loss"]) < 0.05
    assert gpu_records[0]["grad_norm"] == pytest.approx(cpu_records[0]["grad_norm"], rel=0.05)


@pytest.mark.skipif("not __import__('torch').cuda.device_count() >= 2", reason="needs two GPUs")
@pytest.mark.parametrize("reduction", ["sum", "fsdp_sum"])
def test_nccl_bf16_reduction_keeps_the_true_gradient(tmp_path, reduction):
    """PREMUL_SUM in bf16 is known to zero gradients: fsdp_sum (a forced SUM) must give sum's norm."""
    bf16 = ["device=cuda", "world_size=2", "mp.reduce_dtype=bfloat16"]
    _, low = run(tmp_path, f"{reduction}_bf16", f"reduction={reduction}", *bf16)
    _, full = run(tmp_path, f"{reduction}_fp32", f"reduction={reduction}", "device=cuda", "world_size=2")
    assert low[0]["grad_norm"] > 0
    assert low[0]["grad_norm"] == pytest.approx(full[0]["grad_norm"], rel=0.01)
