"""The model's rules, checked before any rank starts: its fields against its architecture, its shape, the
sequence length its positions allow, and a vocabulary that holds the data's tokens.

The own decoder's shape is read from its fields; a Hugging Face model's from its config, read as JSON
without torch (`runner.model.hf_config`, which also holds that config's own rules).
"""

from __future__ import annotations

from omegaconf import DictConfig

from runner.config import ModelConfig
from runner.data.corpus import CorpusError, tokenizer_vocab_size
from runner.layout import near_multiples
from runner.model.hf_config import HFConfigError, ModelShape, model_shape

BYTE_VOCAB = 256

Problems = list[tuple[str, str]]


# The own decoder's fields (ModelConfig's), which a Hugging Face model does not read.
DECODER_FIELDS = ("n_layers", "d_model", "n_heads", "ffn_hidden", "vocab_size", "rope_theta", "norm_eps", "init_std")


def other_architecture_fields(model: DictConfig) -> Problems:
    """Fields set for the other architecture, which this one would silently ignore."""
    if model.arch.value == "hf":
        defaults = ModelConfig()
        return [
            (
                f"model.{name}",
                f"model.{name}={getattr(model, name)} is the own decoder's; model.arch=hf reads a Hugging Face config: "
                "set its key instead, e.g. model.overrides.num_hidden_layers=4",
            )
            for name in DECODER_FIELDS + ("tie_embeddings",)
            if getattr(model, name) != getattr(defaults, name)
        ]
    return [
        (
            f"model.{name}",
            f"model.{name} is for model.arch=hf (a Hugging Face config); model={model.name} is the own decoder "
            "(model.n_layers, model.d_model, ...), or use model=hf_llama, hf_qwen2 or hf",
        )
        for name in ("config", "overrides")
        if getattr(model, name)
    ]


def model_problems(model: DictConfig) -> tuple[ModelShape | None, Problems]:
    """The effective model's shape (None when it has none) and the rules its own fields break.

    The own decoder: attention splits d_model into n_heads heads, and RoPE rotates pairs of features (an even
    head dim). A Hugging Face model: its config must give a causal LM (`runner.model.hf_config`).
    """
    found = other_architecture_fields(model)
    if model.arch.value == "hf":
        try:
            return model_shape(model), found
        except HFConfigError as error:
            return None, found + [(error.field, str(error))]
    if model.d_model % model.n_heads or (model.d_model // model.n_heads) % 2:
        found.append(
            (
                "model.d_model",
                f"model.d_model={model.d_model} must split into model.n_heads={model.n_heads} heads of an even size "
                f"(RoPE rotates feature pairs): use a multiple of {2 * model.n_heads} "
                f"(e.g. {near_multiples(model.d_model, 2 * model.n_heads)})",
            )
        )
    return model_shape(model), found


def positions_problems(cfg: DictConfig, shape: ModelShape | None) -> Problems:
    """A Hugging Face config's declared longest sequence (learned position tables end there)."""
    if shape is None or shape.max_positions is None or cfg.train.seq_len <= shape.max_positions[1]:
        return []
    key, limit = shape.max_positions
    return [
        (
            "train.seq_len",
            f"train.seq_len={cfg.train.seq_len} exceeds the model's {key}={limit}; "
            f"use train.seq_len<={limit}, or model.overrides.{key}={cfg.train.seq_len} if its positions allow it",
        )
    ]


def vocab_problems(cfg: DictConfig, shape: ModelShape | None) -> Problems:
    """Every token id of the data must be a row of the model's embedding: 256 bytes, or the tokenizer's vocab."""
    tokenizer = cfg.data.tokenizer
    if tokenizer is None:
        data_vocab, source = BYTE_VOCAB, "byte-level tokens"
    else:
        try:
            data_vocab = tokenizer_vocab_size(tokenizer)
        except CorpusError as error:
            return [("data.tokenizer", str(error))]
        source = f"the vocab of data.tokenizer={tokenizer}"
    if shape is None or shape.vocab_size >= data_vocab:
        return []
    field = "model.vocab_size" if cfg.model.arch.value != "hf" else "model.overrides"
    fix = "model.vocab_size" if cfg.model.arch.value != "hf" else "model.overrides.vocab_size"
    return [
        (
            field,
            f"{shape.vocab_field}={shape.vocab_size} must be >= {data_vocab} ({source}); "
            f"set {fix}={data_vocab} or more"
            + ("" if tokenizer else ", or data.tokenizer=PATH with a vocab that fits"),
        )
    ]
