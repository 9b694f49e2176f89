#!/usr/bin/env bash
# The GPU path in one go, given one GPU and `make setup TORCH_SPEC=<a CUDA build>` done:
# the GPU-marked tests, then two 124M-parameter-class runs at seq 1024 (bf16 compute,
# fp32 reduction, 40 steps) with their tokens/s and model FLOPs utilisation: the
# runner's own decoder (gpt2_124m), and transformers' LlamaForCausalLM built from a
# config of that size (model=hf_llama: 12 layers, width 768, 12 heads with 4 key/value
# heads, tied 50304-token head). Under 10 minutes on one H100-class GPU; each part has
# its own time limit.
#   bash bench/gpu_smoke.sh        (PY=... for another interpreter, STEPS=... to change the length)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STEPS=${STEPS:-40}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA: install a CUDA build of torch (TORCH_SPEC)'; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

echo "== GPU-marked tests"
timeout 360 "$PY" -m pytest -q -m gpu tests/test_gpu.py

echo "== gpt2_124m, seq 1024, ${STEPS} steps"
run_dir=$(mktemp -d)/gpt2_124m
timeout 240 "$PY" -m runner device=cuda world_size=1 grad_accum=1 model=gpt2_124m \
    train.seq_len=1024 train.global_batch=16 train.steps="$STEPS" train.log_every=10 \
    mp.param_dtype=bfloat16 mp.reduce_dtype=float32 metrics.sketch_dim=0 metrics.count_comm=false \
    wandb.mode=disabled hydra.run.dir="$run_dir"
"$PY" -m bench.gpu_throughput "$run_dir"

echo "== hf_llama (LlamaForCausalLM) at gpt2_124m's size, seq 1024, ${STEPS} steps"
run_dir=$(mktemp -d)/hf_llama_124m
timeout 300 "$PY" -m runner device=cuda world_size=1 grad_accum=1 model=hf_llama \
    model.overrides.hidden_size=768 model.overrides.intermediate_size=2048 model.overrides.num_hidden_layers=12 \
    model.overrides.num_attention_heads=12 model.overrides.num_key_value_heads=4 model.overrides.vocab_size=50304 \
    model.overrides.tie_word_embeddings=true \
    train.seq_len=1024 train.global_batch=16 train.steps="$STEPS" train.log_every=10 \
    mp.param_dtype=bfloat16 mp.reduce_dtype=float32 metrics.sketch_dim=0 metrics.count_comm=false \
    wandb.mode=disabled hydra.run.dir="$run_dir"
"$PY" -m bench.gpu_throughput "$run_dir"
