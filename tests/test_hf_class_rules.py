"""A Hugging Face config held before launch to what transformers' config class makes of it: generated cases.

- Every key of each preset, misspelt (a letter dropped, two swapped), is refused naming the key and the class's
  nearest name; every key the class takes, and a legacy key transformers converts (`rope_theta`), is accepted.
  (transformers keeps a misspelt key as an attribute nothing reads: `num_hidden_layer=4` trained 2 layers.)
- The heads' even-size rule is the rotary models': for each model type, a width that splits into heads of an
  odd size is refused where the class has rotary embeddings (Llama, Qwen2, Mistral) and accepted where it has
  learned positions (GPT-2, OPT); each accepted config trains a step in a real gloo world.
- Under sp > 1, each attention feature Ulysses cannot wrap (attention dropout, a sliding window shorter than
  the sequence, logit soft-capping), set on a model type that has it, is refused before launch naming the key,
  and is accepted at sp=1; the ranks, given the same config at sp=2 without the launcher, refuse it too.
"""

from __future__ import annotations

import copy
import math

import pytest
from gloo_world import run_in_world
from helpers import MODEL_PRESETS
from omegaconf import OmegaConf

from runner.config import config_with, rank_config
from runner.sweep.validate import config_problems

pytestmark = pytest.mark.slow

BASE = {"train.steps": 1, "train.seq_len": 32, "train.global_batch": 8, "grad_accum": 2, "wandb.mode": "disabled"}
PRESETS = ("hf_llama", "hf_qwen2")
SMALL = {"num_hidden_layers": 1, "vocab_size": 256, "max_position_embeddings": 256}


def preset_overrides(preset: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(MODEL_PRESETS / f"{preset}.yaml").overrides)


def hf_config(overrides: dict, **dotted):
    cfg = config_with({**BASE, **dotted, "model.arch": "hf", "model.name": "hf"})
    OmegaConf.update(cfg, "model.overrides", overrides, merge=False)
    return cfg


def problems_of(cfg) -> str:
    return " | ".join(message for _, message in config_problems(cfg))


def misspellings(key: str) -> list[str]:
    swapped = key[:1] + key[2] + key[1] + key[3:] if len(key) > 3 and key[1] != key[2] else None
    return [k for k in (key[:-1], swapped) if k and k != key]


MISSPELT = [
    (preset, key, wrong) for preset in PRESETS for key in preset_overrides(preset) for wrong in misspellings(key)
]


@pytest.mark.parametrize("preset, key, wrong", MISSPELT, ids=[f"{p}-{w}" for p, _, w in MISSPELT])
def test_a_misspelt_key_is_refused_with_the_nearest_names(preset, key, wrong):
    overrides = preset_overrides(preset)
    overrides[wrong] = overrides[key]
    said = problems_of(hf_config(overrides))
    assert f"model.overrides.{wrong} is not a key of" in said, said
    assert f"model.overrides.{key}" in said.split(f"model.overrides.{wrong}", 1)[1], said  # the nearest name


@pytest.mark.parametrize("preset", PRESETS)
def test_keys_the_class_takes_and_legacy_keys_it_converts_are_accepted(preset):
    overrides = {**preset_overrides(preset), "rope_theta": 500000.0, "use_cache": False, "rms_norm_eps": 1e-5}
    assert problems_of(hf_config(overrides)) == ""


# (model type, its causal LM, whether it has rotary embeddings, its width/heads keys)
TYPES = [
    ("llama", "LlamaForCausalLM", True, "hidden_size", "num_attention_heads", "intermediate_size"),
    ("qwen2", "Qwen2ForCausalLM", True, "hidden_size", "num_attention_heads", "intermediate_size"),
    ("mistral", "MistralForCausalLM", True, "hidden_size", "num_attention_heads", "intermediate_size"),
    ("gpt2", "GPT2LMHeadModel", False, "n_embd", "n_head", "n_inner"),
    ("opt", "OPTForCausalLM", False, "hidden_size", "num_attention_heads", "ffn_dim"),
]


def model_of(model_type: str, cls: str, width_key: str, heads_key: str, ffn_key: str, width: int, heads: int) -> dict:
    config = {"model_type": model_type, "architectures": [cls], width_key: width, heads_key: heads, ffn_key: 64}
    if model_type == "gpt2":
        return {**config, "n_layer": 1, "vocab_size": 256, "n_positions": 256, "attn_pdrop": 0.0}
    if model_type == "opt":
        return {
            **config,
            "num_hidden_layers": 1,
            "vocab_size": 256,
            "max_position_embeddings": 256,
            "word_embed_proj_dim": width,
        }
    return {**config, **SMALL, "num_key_value_heads": heads}


def first_steps(cases: list[tuple[str, object]]) -> dict[str, str]:
    """On every rank: each config's parts and first step; "ok" or the error, per case."""
    import torch

    from runner.layout import ParallelLayout
    from runner.model.parallel import build_meshes
    from runner.train.components import build_parts
    from runner.train.loop import Trainer

    outcomes = {}
    for case, composed in cases:
        cfg = rank_config(composed)
        try:
            parts = build_parts(cfg, build_meshes(ParallelLayout.from_config(cfg), "cpu"), torch.device("cpu"))
            record = Trainer(parts).step(1)
            outcomes[case] = "ok" if math.isfinite(record["loss"]) else "not finite"
        except Exception as error:  # noqa: BLE001 - the outcome is the test's subject
            outcomes[case] = f"{type(error).__name__}: {error}"
    return outcomes


def test_the_even_head_size_rule_is_the_rotary_models_only():
    accepted = []
    for model_type, cls, rotary, width_key, heads_key, ffn_key in TYPES:
        odd = model_of(model_type, cls, width_key, heads_key, ffn_key, width=12, heads=4)  # heads of 3 features
        said = problems_of(hf_config(odd))
        if rotary:
            assert "rotary embeddings rotate feature pairs" in said and f"{width_key}=12" in said, (model_type, said)
        else:
            assert said == "", (model_type, said)
            accepted.append((model_type, hf_config(odd)))
    assert [case for case, _ in accepted] == ["gpt2", "opt"]
    outcomes = run_in_world(first_steps, 2, accepted, timeout_s=600)[0]
    assert outcomes == {"gpt2": "ok", "opt": "ok"}


# (feature, model type and config that has it, the key the refusal names)
LLAMA = model_of("llama", "LlamaForCausalLM", "hidden_size", "num_attention_heads", "intermediate_size", 64, 4)
FEATURES = [
    ("attention dropout", {**LLAMA, "attention_dropout": 0.1}, "attention_dropout"),
    (
        "attention dropout",
        {**model_of("gpt2", "GPT2LMHeadModel", "n_embd", "n_head", "n_inner", 64, 4), "attn_pdrop": 0.1},
        "attn_pdrop",
    ),
    (
        "sliding window",
        {
            **model_of(
                "mistral", "MistralForCausalLM", "hidden_size", "num_attention_heads", "intermediate_size", 64, 4
            ),
            "sliding_window": 8,
        },
        "sliding_window",
    ),
    (
        "sliding window",
        {
            **model_of("qwen2", "Qwen2ForCausalLM", "hidden_size", "num_attention_heads", "intermediate_size", 64, 4),
            "use_sliding_window": True,
            "sliding_window": 8,
            "max_window_layers": 0,
        },
        "sliding_window",
    ),
    (
        "logit soft-capping",
        {
            **model_of("gemma2", "Gemma2ForCausalLM", "hidden_size", "num_attention_heads", "intermediate_size", 64, 4),
            "head_dim": 16,
            "sliding_window": 4096,
        },
        "attn_logit_softcapping",
    ),
]


def test_what_ulysses_cannot_wrap_is_refused_before_launch_as_the_ranks_refuse_it():
    at_sp2 = []
    for n, (feature, config, key) in enumerate(FEATURES):
        said = problems_of(hf_config(copy.deepcopy(config), world_size=2, sp=2, grad_accum=1))
        assert f"sp=2: the model's {key}=" in said and "use sp=1" in said, (feature, said)
        assert problems_of(hf_config(copy.deepcopy(config), world_size=2, sp=1)) == "", feature
        at_sp2.append((f"{n}-{feature}", hf_config(copy.deepcopy(config), world_size=2, sp=2, grad_accum=1)))
    outcomes = run_in_world(first_steps, 2, at_sp2, timeout_s=600)[0]
    for case, outcome in outcomes.items():  # the ground truth: the ranks refuse it at their first step
        assert outcome.startswith("UnsupportedArchitecture") and "sp=2 does not support" in outcome, (case, outcome)
