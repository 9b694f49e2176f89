"""Hugging Face models built from a config (`model.arch=hf`): seed-determined weights, the plain HF forward,
tied heads, the effective config the launcher checks, and the attention routing's refusals.

Gradients in sharded worlds are tests/test_hf_gradients.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from runner.config import ModelConfig
from runner.model.hf import HFCausalLM, UnsupportedArchitecture
from runner.model.hf_config import HFConfigError, checked_hf_config, model_shape
from runner.model.registry import build_model

PRESETS = Path(__file__).resolve().parents[1] / "conf" / "model"


def preset(name: str, **overrides) -> ModelConfig:
    cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(PRESETS / f"{name}.yaml"))
    cfg.overrides.update(overrides)
    return OmegaConf.to_object(cfg)


def hf_file(tmp_path: Path, **config) -> ModelConfig:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(ModelConfig), {"name": "hf", "arch": "hf", "config": str(path)})
    )


LLAMA = dict(
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    vocab_size=300,
)


@pytest.mark.parametrize("name, cls", [("hf_llama", "LlamaForCausalLM"), ("hf_qwen2", "Qwen2ForCausalLM")])
def test_weights_depend_on_the_seed_only(name, cls):
    first, again, other = (build_model(preset(name), seed) for seed in (5, 5, 6))
    assert type(first.hf).__name__ == cls and len(first.layers()) == 2
    for (param_name, a), b, c in zip(first.named_parameters(), again.parameters(), other.parameters()):
        assert a.dtype == torch.float32
        assert torch.equal(a, b), param_name
        if a.dim() > 1:
            assert not torch.equal(a, c), param_name


def test_building_leaves_the_callers_generator_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    build_model(preset("hf_llama"), 1)
    assert torch.equal(torch.rand(3), expected)


def test_logits_are_the_plain_hf_models_at_absolute_positions():
    model = build_model(preset("hf_llama"), 0)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(tokens)
        torch.testing.assert_close(logits, model.hf(input_ids=tokens).logits, rtol=0, atol=0)
        # The second half at offset 16 sees the same rotary positions as in the whole sequence:
        # its logits differ only through attention's missing context, not through positions.
        shifted = model.hf(input_ids=tokens[:, 16:], position_ids=torch.arange(16, 32)[None]).logits
        torch.testing.assert_close(model(tokens[:, 16:], position_offset=16), shifted, rtol=0, atol=0)
        changed = tokens.clone()
        changed[:, 20:] = (changed[:, 20:] + 1) % 256
        torch.testing.assert_close(model(changed)[:, :20], logits[:, :20])  # causal


def test_qwen2_preset_ties_its_head_and_llama_does_not():
    qwen, llama = build_model(preset("hf_qwen2"), 0), build_model(preset("hf_llama"), 0)
    assert qwen.hf.lm_head.weight is qwen.hf.model.embed_tokens.weight
    assert llama.hf.lm_head.weight is not llama.hf.model.embed_tokens.weight
    assert qwen.hf.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2's biased q/k/v


def test_a_users_config_json_with_overrides(tmp_path):
    cfg = hf_file(tmp_path, **LLAMA, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.overrides = {"num_hidden_layers": 3, "rope_parameters": {"rope_theta": 500000.0}}
    model = build_model(cfg, 0)
    assert len(model.layers()) == 3 and model.hf.config.vocab_size == 300
    # A nested dict is merged key by key: the file's rope_type stays.
    assert model.hf.config.rope_parameters == {"rope_type": "default", "rope_theta": 500000.0}
    assert checked_hf_config(cfg)["num_hidden_layers"] == 3


def test_the_launcher_reads_the_effective_shape_without_transformers(tmp_path):
    llama, qwen2 = model_shape(preset("hf_llama")), model_shape(preset("hf_qwen2"))
    assert (llama.heads, llama.kv_heads, llama.vocab_size, llama.layers, llama.width, llama.ffn) == (
        4,
        2,
        256,
        2,
        64,
        192,
    )
    assert (qwen2.heads, qwen2.kv_heads, qwen2.vocab_size, qwen2.tied, llama.tied) == (4, 2, 256, True, False)
    shape = model_shape(preset("hf_llama", num_attention_heads=8, vocab_size=512))
    assert (shape.heads, shape.kv_heads, shape.vocab_size) == (8, 2, 512)
    assert shape.heads_field == "the model's num_attention_heads"
    gpt2 = model_shape(
        hf_file(tmp_path, model_type="gpt2", architectures=["GPT2LMHeadModel"], n_head=12, vocab_size=50257)
    )
    assert (gpt2.heads, gpt2.kv_heads, gpt2.heads_field) == (12, 12, "the model's n_head")  # GPT-2's own key names
    no_kv = model_shape(hf_file(tmp_path, **LLAMA))
    assert no_kv.kv_heads == no_kv.heads == 4  # transformers' default: as many key/value heads as query heads


@pytest.mark.parametrize(
    "config, message",
    [
        ({**LLAMA, "architectures": ["LlamaForSequenceClassification"]}, "not a causal LM"),
        ({**LLAMA, "model_type": "t5", "architectures": None, "is_encoder_decoder": True}, "encoder-decoder"),
        ({key: v for key, v in LLAMA.items() if key != "model_type"}, "no model_type"),
        ({key: v for key, v in LLAMA.items() if key != "vocab_size"}, "model.overrides.vocab_size=VALUE"),
        ({**LLAMA, "num_attention_heads": 0}, "num_attention_heads=0 must be a positive integer"),
    ],
    ids=["classifier", "encoder_decoder", "no_model_type", "no_vocab", "no_heads"],
)
def test_configs_that_cannot_give_a_causal_lm(tmp_path, config, message):
    with pytest.raises(HFConfigError, match=message):
        checked_hf_config(hf_file(tmp_path, **config))


def test_a_config_without_architectures_is_left_to_transformers_causal_lm_mapping(tmp_path):
    """No `architectures`: the ranks ask transformers, which knows whether the model type has a causal LM."""
    llama = {key: v for key, v in LLAMA.items() if key != "architectures"}
    assert type(build_model(hf_file(tmp_path, **llama), 0).hf).__name__ == "LlamaForCausalLM"
    # transformers maps bert to BertLMHeadModel, which attends both ways unless is_decoder: refused as not causal.
    bert = dict(model_type="bert", hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=300)
    with pytest.raises(UnsupportedArchitecture, match="BertLMHeadModel is not causal"):
        build_model(hf_file(tmp_path, **bert), 0)
    assert build_model(hf_file(tmp_path, **bert, is_decoder=True), 0).name == "BertLMHeadModel"
    with pytest.raises(UnsupportedArchitecture, match="'roberta' has no causal LM|'t5' has no causal LM"):
        build_model(hf_file(tmp_path, **{**llama, "model_type": "t5", "d_model": 32, "num_heads": 4}), 0)
    with pytest.raises(UnsupportedArchitecture, match="not an architecture of transformers"):
        build_model(hf_file(tmp_path, **{**llama, "model_type": "no_such_model"}), 0)


class Sp2:
    """An attention function standing in for Ulysses at sp=2 (only its `sp` is read by the checks)."""

    sp = 2

    def __call__(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def test_routed_attention_is_the_models_own_attention():
    model = build_model(preset("hf_llama"), 0)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(tokens)
        model.use_attention(Sp2())
        assert model.hf.config._attn_implementation.startswith("runner_attention_")
        torch.testing.assert_close(model(tokens), before)
        assert model.routed_calls is None  # checked by the first forward


def test_routed_attention_refuses_what_it_cannot_do():
    model = build_model(preset("hf_qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=0), 0)
    model.use_attention(Sp2())
    with pytest.raises(UnsupportedArchitecture, match=r"sliding window \(8\) shorter than the sequence \(32\)"):
        model(torch.zeros((1, 16), dtype=torch.long))  # 16 local positions at sp=2: 32 in all


def test_a_model_that_bypasses_the_attention_interface_is_refused_for_sp():
    class Bypassing(torch.nn.Module):
        _no_split_modules = ["Linear"]
        config = type("Config", (), {"_attn_implementation": "eager"})()

        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def set_attn_implementation(self, name):  # as transformers does for such a model: warns, changes nothing
            pass

    model = HFCausalLM(Bypassing())
    assert model.layers() == [model.hf.proj]
    with pytest.raises(UnsupportedArchitecture, match="use sp=1 with this model"):
        model.use_attention(Sp2())
