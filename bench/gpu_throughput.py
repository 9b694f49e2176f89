"""`python -m bench.gpu_throughput JOB_DIR`: tokens/s and model FLOPs utilisation of a finished GPU job.

FLOPs per token (PaLM's appendix B, as torchtitan and nanoGPT count them):
6 N for the matmuls of forward and backward, N the non-embedding parameters
plus the output head, and 12 L d T for attention's scores and values (L
layers, width d, sequence length T). MFU = achieved FLOP/s over the device's
dense bf16 peak (from its name, or PEAK_TFLOPS).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

from omegaconf import OmegaConf

from runner.config import ffn_width

# Dense bf16 tensor-core peaks (TFLOP/s), from the vendors' data sheets (SXM parts).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "L4": 121.0}
WARMUP_STEPS = 5


def flops_per_token(model: dict, seq_len: int) -> float:
    d, layers, vocab = model["d_model"], model["n_layers"], model["vocab_size"]
    ffn = ffn_width(SimpleNamespace(**model))
    per_layer = 4 * d * d + 3 * d * ffn  # attention projections, SwiGLU
    matmul_params = layers * per_layer + d * vocab  # the head is a matmul per token; the embedding is a lookup
    return 6 * matmul_params + 12 * layers * d * seq_len


def main(job_dir: Path) -> None:
    cfg = OmegaConf.to_container(OmegaConf.load(job_dir / "config.yaml"))
    summary = json.loads((job_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    timed = records[WARMUP_STEPS:] or records
    world = cfg["world_size"]
    tokens_per_step = cfg["train"]["global_batch"] * cfg["train"]["seq_len"]
    step_s = statistics.median(r["step_time_s"] for r in timed)
    tokens_per_s = tokens_per_step / step_s
    device = summary.get("device", "")
    peak = float(os.environ.get("PEAK_TFLOPS") or next((v for k, v in PEAK_TFLOPS.items() if k in device), "nan"))
    achieved = tokens_per_s * flops_per_token(cfg["model"], cfg["train"]["seq_len"]) / world / 1e12
    print(
        f"device: {device} x {world}; status {summary.get('status')}, {len(records)} steps, median step {step_s * 1e3:.1f} ms"
    )
    print(f"tokens/s: {tokens_per_s:,.0f} ({tokens_per_s / world:,.0f} per GPU)")
    print(f"MFU: {achieved / peak:.1%} ({achieved:.1f} TFLOP/s per GPU of a {peak:g} TFLOP/s bf16 peak)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
