#!/usr/bin/env bash
# The GPU path in one go, given one GPU and `make setup TORCH_SPEC=<a CUDA build>` done:
# the GPU-marked tests, then a 124M-parameter run at seq 1024 (bf16 compute, fp32
# reduction, 40 steps) with its tokens/s and model FLOPs utilisation. Under 8 minutes
# on one H100-class GPU; each part has its own time limit.
#   bash bench/gpu_smoke.sh        (PY=... for another interpreter, STEPS=... to change the length)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STEPS=${STEPS:-40}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA: install a CUDA build of torch (TORCH_SPEC)'; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

echo "== GPU-marked tests"
timeout 240 "$PY" -m pytest -q -m gpu tests/test_gpu.py

echo "== gpt2_124m, seq 1024, ${STEPS} steps"
run_dir=$(mktemp -d)/gpt2_124m
timeout 240 "$PY" -m runner device=cuda world_size=1 grad_accum=1 model=gpt2_124m \
    train.seq_len=1024 train.global_batch=16 train.steps="$STEPS" train.log_every=10 \
    mp.param_dtype=bfloat16 mp.reduce_dtype=float32 metrics.sketch_dim=0 metrics.count_comm=false \
    wandb.mode=disabled hydra.run.dir="$run_dir"
"$PY" -m bench.gpu_throughput "$run_dir"
