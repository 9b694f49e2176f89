"""The effective Hugging Face config of `model.arch=hf`, read and checked without torch or transformers.

The sweep side refuses bad input before any rank starts, and it never
imports torch (importing transformers' model registry would: 7 s). So it reads
the config.json itself, as plain JSON, and applies `model.overrides` on top
exactly as the ranks will (`runner.model.hf` hands the same dict to
transformers' `AutoConfig.for_model`).

Causal-LM-ness is told from the config's `architectures`, the class names that
`save_pretrained` writes from the model that saved it (every config on the
Hugging Face Hub has them): one must end in `ForCausalLM` (or `LMHeadModel`,
GPT-2's family's name). That is what the checkpoint was; it refuses
encoder-only (`BertForMaskedLM`), sequence-to-sequence
(`T5ForConditionalGeneration`), multimodal (`Qwen2VLForConditionalGeneration`)
and head variants (`LlamaForSequenceClassification`) by name, with no
list of model types to keep up to date. `is_encoder_decoder: true` is refused
in any case. A config without `architectures` (a config class saved on its
own) names no model, so it is accepted on its `model_type` alone; the ranks
then ask transformers' causal-LM mapping (`AutoModelForCausalLM`), which fails
with the model type named if it has none, and check that the model built is
causal (`runner.model.hf.check_causal`: that mapping also holds BERT's
bidirectional LM head).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.layout import divisors, near_multiples

CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")  # LlamaForCausalLM ...; GPT2LMHeadModel (GPT-2's family)
# Key aliases of PretrainedConfig.attribute_map in the architectures that use other names (GPT-2, Falcon, ...).
HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
KV_HEAD_KEYS = ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num")
VOCAB_KEYS = ("vocab_size", "padded_vocab_size")
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len")
# Size keys, for the launcher's memory estimate (runner.sweep.memory).
WIDTH_KEYS = ("hidden_size", "n_embd", "d_model")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
FFN_KEYS = ("intermediate_size", "n_inner", "ffn_dim")


class HFConfigError(ValueError):
    """The config cannot give a causal LM; `field` is the config field to change."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class ModelShape:
    """What the sweep side's rules need of a model, whatever its architecture."""

    heads: int  # query heads: Ulysses splits them over sp
    kv_heads: int  # key/value heads (fewer under grouped-query attention)
    vocab_size: int
    heads_field: str  # what sets them, for messages ("model.n_heads", "the model's num_attention_heads")
    vocab_field: str
    max_positions: tuple[str, int] | None = None  # (key, value): the longest sequence the config declares
    # Its size, for the memory estimate: layers, width, feed-forward width, whether the head is the embedding,
    # and (field, value) of what sets them, to name when it is too big.
    layers: int = 0
    width: int = 0
    ffn: int = 0
    tied: bool = False
    size_fields: tuple[tuple[str, Any], ...] = ()


def _first(config: dict, keys: tuple[str, ...]) -> tuple[str, Any] | None:
    return next(((key, config[key]) for key in keys if config.get(key) is not None), None)


def config_file(path_text: str) -> Path:
    """The config.json `model.config` names: the file, or the one in a model folder (as from_pretrained takes)."""
    path = Path(path_text).expanduser()
    return path / "config.json" if path.is_dir() else path


def _read_json(path_text: str) -> dict:
    path = config_file(path_text)
    if not path.is_file():
        raise HFConfigError(
            "model.config",
            f"model.config={path_text} does not exist; give a Hugging Face config.json (or the folder that holds one)",
        )
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise HFConfigError("model.config", f"model.config={path_text} is not JSON ({error.msg})") from None
    if not isinstance(config, dict):
        raise HFConfigError("model.config", f"model.config={path_text} holds a {type(config).__name__}, not a config")
    return config


def merged(base: dict, overrides: dict) -> dict:
    """`base` with `overrides` on top; a nested dict (e.g. rope_parameters) is merged key by key."""
    result = dict(base)
    for key, value in overrides.items():
        nested = isinstance(value, dict) and isinstance(result.get(key), dict)
        result[key] = merged(result[key], value) if nested else value
    return result


def hf_config_dict(model) -> dict:
    """The config.json (when `model.config` is set) with `model.overrides` on top, as plain JSON values."""
    config = {} if model.config is None else _read_json(model.config)
    overrides = model.overrides
    if not isinstance(overrides, dict):  # a DictConfig on the sweep side
        from omegaconf import OmegaConf

        overrides = OmegaConf.to_container(overrides, resolve=True)
    return merged(config, overrides)


def checked_hf_config(model) -> dict:
    """The effective config, or HFConfigError naming the field to change."""
    config = hf_config_dict(model)
    if model.config is None:
        source = f"model={model.name} (model.overrides)"
    else:
        source = f"model.config={model.config}" + (" with model.overrides" if len(model.overrides) else "")
    if not config.get("model_type"):
        hint = (
            "" if model.config is not None else "; give model.config=PATH/config.json or a preset (hf_llama, hf_qwen2)"
        )
        raise HFConfigError("model.config", f"{source} has no model_type: not a Hugging Face config{hint}")
    if config.get("is_encoder_decoder"):
        raise HFConfigError(
            "model.config", f"{source} is an encoder-decoder ({config['model_type']}); only causal LMs are trained"
        )
    architectures = config.get("architectures") or []
    if architectures and not any(str(name).endswith(CAUSAL_LM_SUFFIXES) for name in architectures):
        raise HFConfigError(
            "model.config",
            f"{source} is not a causal LM: architectures={architectures}; valid: a config whose "
            "architectures name a *ForCausalLM class (e.g. LlamaForCausalLM, Qwen2ForCausalLM)",
        )
    for keys in (HEAD_KEYS, VOCAB_KEYS):
        if _first(config, keys) is None:
            raise HFConfigError(
                "model.overrides", f"{source} has no {keys[0]}; set it: model.overrides.{keys[0]}=VALUE"
            )
    _check_sizes(config, source)
    return config


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_sizes(config: dict, source: str) -> None:
    """The rules every attention and layer stack of transformers' causal LMs relies on, so that no size reaches
    a rank and fails there: every size a positive integer; the query heads shared by whole groups of key/value
    heads."""
    for keys in (HEAD_KEYS, VOCAB_KEYS, KV_HEAD_KEYS, LAYER_KEYS, WIDTH_KEYS, FFN_KEYS, POSITION_KEYS, ("head_dim",)):
        found = _first(config, keys)  # an absent or null key takes the config class's default
        if found and not _positive_int(found[1]):
            key, value = found
            raise HFConfigError(
                "model.overrides", f"{source}: {key}={value!r} must be a positive integer (model.overrides.{key})"
            )
    heads_key, heads = _first(config, HEAD_KEYS)
    kv = _first(config, KV_HEAD_KEYS)
    if kv and heads % kv[1]:
        raise HFConfigError(
            "model.overrides",
            f"{source}: model.overrides.{heads_key}={heads} query heads cannot be shared among "
            f"model.overrides.{kv[0]}={kv[1]} key/value heads; valid {kv[0]}: {', '.join(map(str, divisors(heads)))}",
        )
    width = _first(config, WIDTH_KEYS)
    if config.get("head_dim") is None and width and width[1] % heads:
        raise HFConfigError(
            "model.overrides",
            f"{source}: model.overrides.{width[0]}={width[1]} must split into model.overrides.{heads_key}={heads} "
            f"heads: use {width[0]}={near_multiples(width[1], heads)}, or set model.overrides.head_dim",
        )
    # A rotary model's heads must also be of an even size: checked against transformers' config class, which
    # tells a rotary model from one with learned positions (`runner.sweep.hf_check`).


def model_shape(model) -> ModelShape:
    """Heads and vocab of the effective model (`model.arch=hf`: its config; else the own decoder's fields).

    Raises HFConfigError for an HF config that cannot give a causal LM.
    """
    if model.arch.value != "hf":
        from runner.config import ffn_width

        return ModelShape(
            heads=model.n_heads,
            kv_heads=model.n_heads,
            vocab_size=model.vocab_size,
            heads_field="model.n_heads",
            vocab_field="model.vocab_size",
            layers=model.n_layers,
            width=model.d_model,
            ffn=ffn_width(model),
            tied=model.tie_embeddings,
            size_fields=tuple(
                (f"model.{name}", getattr(model, name)) for name in ("n_layers", "d_model", "vocab_size", "ffn_hidden")
            ),
        )
    config = checked_hf_config(model)
    heads_key, heads = _first(config, HEAD_KEYS)
    kv = _first(config, KV_HEAD_KEYS)
    vocab_key, vocab = _first(config, VOCAB_KEYS)
    positions = _first(config, POSITION_KEYS)
    sizes = {keys: _first(config, keys) for keys in (LAYER_KEYS, WIDTH_KEYS, FFN_KEYS)}
    layers, width, ffn = (found[1] if found and isinstance(found[1], int) else 0 for found in sizes.values())
    size_keys = [sizes[LAYER_KEYS], sizes[WIDTH_KEYS], (vocab_key, vocab), sizes[FFN_KEYS]]
    return ModelShape(
        heads=heads,
        kv_heads=kv[1] if kv else heads,  # transformers' default: one key/value head per query head
        vocab_size=vocab,
        heads_field=f"the model's {heads_key}",
        vocab_field=f"the model's {vocab_key}",
        max_positions=positions if positions and isinstance(positions[1], int) else None,
        layers=layers,
        width=width,
        ffn=ffn or 4 * width,  # GPT-2's n_inner: null means 4 x the width
        tied=bool(config.get("tie_word_embeddings", False)),
        size_fields=tuple((f"model.overrides.{key}", value) for key, value in filter(None, size_keys)),
    )
