"""Every module imports on a machine without CUDA (the GPU path is chosen at run time, not import time)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from omegaconf import OmegaConf

import analysis
import bench
import runner

SCRIPTS = {"bench.trivial_rank", "bench.launcher_rank"}  # rank scripts: they join a world when imported
MODULES = sorted(
    info.name
    for package in (runner, analysis, bench)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
    if info.name not in SCRIPTS
)


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    assert importlib.import_module(name).__name__ == name


def test_flops_per_token_of_gpt2_124m():
    """6 x 123.6M matmul parameters (12 layers of 7.08M, head 38.6M) + 12 L d T attention at T=1024."""
    from bench.gpu_throughput import flops_per_token

    model = {"d_model": 768, "n_layers": 12, "vocab_size": 50304, "ffn_hidden": None}
    per_layer = 4 * 768**2 + 3 * 768 * 2048
    assert flops_per_token(model, 1024) == 6 * (12 * per_layer + 768 * 50304) + 12 * 12 * 768 * 1024


def test_flops_per_token_of_an_hf_model_counts_its_own_matmuls():
    """hf_llama: q and o 64x64, k and v 64x32 (2 of 4 heads), a 3 x 64x192 SwiGLU, 2 layers, a 64x256 head."""
    from bench.gpu_throughput import flops_per_token
    from tests.helpers import MODEL_PRESETS

    model = OmegaConf.to_container(OmegaConf.load(MODEL_PRESETS / "hf_llama.yaml"))
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 192
    assert flops_per_token(model, 128) == 6 * (2 * per_layer + 64 * 256) + 12 * 2 * 64 * 128
    tied = OmegaConf.to_container(OmegaConf.load(MODEL_PRESETS / "hf_qwen2.yaml"))
    assert flops_per_token(tied, 128) == flops_per_token(model, 128)  # the tied head is a matmul all the same
