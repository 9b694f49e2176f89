"""Hugging Face causal LMs built from a config (`model.arch=hf`): random weights from the seed, nothing downloaded.

The effective config is `runner.model.hf_config`'s (the config.json of
`model.config`, or none, with `model.overrides` on top), the same dict the
launcher checked. transformers builds its `*ForCausalLM` on CPU in float32;
its own initialisation (`_init_weights`, torch's global generator) runs under
`torch.random.fork_rng` after `torch.manual_seed(seed)`, so every rank builds
bit-identical weights from the seed alone and the caller's generator is left
as it was.

`HFCausalLM` offers what `runner.model.registry` asks of a model:

- `forward(tokens, position_offset)` returns the logits only: no labels (the
  runner computes the loss from logits, `runner.train.reduction`), no
  attention mask (a sequence's padding comes after its last target, and
  attention is causal), no cache; `position_ids` start at `position_offset`,
  so rotary (or learned) positions are absolute under sequence parallelism.
- `layers()`: the modules the model names in `_no_split_modules` (its decoder
  layers, what accelerate's FSDP auto-wrap shards too). The root unit holds
  the embedding, the final norm and the head; a tied head (Qwen2's small
  sizes) is one parameter of that unit, so it stays tied and its gradient is
  the sum of both uses.
- `use_attention(fn)` (Ulysses under sp > 1): registers an attention function
  with transformers' `AttentionInterface` and switches the model to it. Models
  look their attention up there by `config._attn_implementation`
  (`ALL_ATTENTION_FUNCTIONS.get_interface`); a model that does not is refused.
  transformers builds no mask for an implementation without a registered mask
  function (`masking_utils._preprocess_mask_arguments`: attention_mask None),
  which is right here: a mask of the local chunk would be wrong over the
  gathered sequence, and `fn` applies causality over the whole sequence. q, k
  and v arrive rotated at their absolute positions, [batch, heads, T/sp,
  head_dim], k and v with the model's key/value heads (fewer under
  grouped-query attention: `runner.model.ulysses` moves them as they are when
  sp divides their count, else repeats them first). Without sp the model keeps
  transformers' own SDPA attention: the plain Hugging Face model.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn as nn

from runner.config import ModelConfig
from runner.model.decoder import AttentionFn
from runner.model.hf_config import checked_hf_config

_names = itertools.count()


class UnsupportedArchitecture(RuntimeError):
    """The model cannot run as asked (sequence parallelism through its attention); the message says why."""


def hf_config(cfg: ModelConfig):
    """transformers' config object of the effective config (its class from `model_type`)."""
    from transformers import CONFIG_MAPPING

    config = dict(checked_hf_config(cfg))
    model_type = config.pop("model_type")
    if model_type not in CONFIG_MAPPING:
        import transformers

        raise UnsupportedArchitecture(
            f"model_type={model_type!r} is not an architecture of transformers {transformers.__version__} "
            "(models with remote code are not supported)"
        )
    return CONFIG_MAPPING[model_type].from_dict(config)


def build_hf(cfg: ModelConfig, seed: int) -> HFCausalLM:
    """The `*ForCausalLM` of the effective config, its weights from `seed` alone (float32, on CPU)."""
    from transformers import AutoModelForCausalLM

    config = hf_config(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = HFCausalLM(AutoModelForCausalLM.from_config(config, dtype=torch.float32))
        except ValueError as error:  # a model_type without a causal LM: transformers names it
            raise UnsupportedArchitecture(f"model_type={config.model_type!r} has no causal LM: {error}") from None
        check_causal(model)
    return model


def check_causal(model: HFCausalLM) -> None:
    """Refuse a model whose logits at a position depend on later tokens (e.g. BERT's LM head without
    is_decoder=true, which transformers' causal-LM mapping builds all the same): two sequences that differ
    in their last token only must give the same logits before it."""
    vocab = model.hf.config.get_text_config().vocab_size
    tokens = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6]]) % vocab
    was_training = model.training
    model.eval()  # no dropout
    with torch.no_grad():
        logits = model(tokens)
    model.train(was_training)
    if not torch.allclose(logits[0, :-1], logits[1, :-1], rtol=0, atol=1e-5):
        raise UnsupportedArchitecture(
            f"{model.name} is not causal: its logits depend on later tokens (a model_type whose LM head "
            "attends both ways); give a decoder-only config"
        )


class HFCausalLM(nn.Module):
    def __init__(self, hf: nn.Module):
        super().__init__()
        self.hf = hf
        # [routed attention calls], checked by the first forward after use_attention (None: nothing to check).
        # A list, so that the function registered globally with transformers holds it and not this model.
        self.routed_calls: list[int] | None = None

    @property
    def name(self) -> str:
        return type(self.hf).__name__

    def layers(self) -> list[nn.Module]:
        """The decoder layers, by the class names the model gives for sharding (`_no_split_modules`)."""
        unit_names = set(getattr(self.hf, "_no_split_modules", None) or ())
        layers = [module for module in self.hf.modules() if type(module).__name__ in unit_names]
        if not layers:
            raise UnsupportedArchitecture(f"{self.name} names no decoder layer class (_no_split_modules) to shard")
        return layers

    def use_attention(self, attention: AttentionFn) -> None:
        """Every attention of the model through `attention(q, k, v)` (see the module docstring)."""
        name = f"runner_attention_{next(_names)}"
        from transformers import AttentionInterface

        self.routed_calls = [0]
        AttentionInterface.register(name, routed(attention, self.name, self.routed_calls))
        self.hf.set_attn_implementation(name)  # only warns when the model cannot take it: checked next
        if self.hf.config._attn_implementation != name:
            raise UnsupportedArchitecture(
                f"{self.name} does not look its attention up in transformers' AttentionInterface, so sequence "
                "parallelism cannot wrap it; use sp=1 with this model"
            )

    def forward(self, tokens: torch.Tensor, position_offset: int = 0) -> torch.Tensor:
        """Logits [batch, seq, vocab]; `position_offset` is the first token's absolute position."""
        positions = torch.arange(position_offset, position_offset + tokens.shape[1], device=tokens.device)
        logits = self.hf(input_ids=tokens, position_ids=positions.unsqueeze(0), use_cache=False).logits
        if self.routed_calls is not None:  # the first forward after use_attention: did attention go through it?
            if self.routed_calls[0] == 0:
                raise UnsupportedArchitecture(
                    f"{self.name} did not call the registered attention function, so sequence parallelism "
                    "cannot wrap its attention; use sp=1 with this model"
                )
            self.routed_calls = None
        return logits


def routed(attention: AttentionFn, model: str, calls: list[int]):
    """A transformers attention function (the AttentionInterface's signature) that runs `attention(q, k, v)`."""
    sp = getattr(attention, "sp", 1)

    def routed_attention(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,  # of the local chunk: causality is applied over the whole sequence
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        sliding_window: int | None = None,
        softcap: float | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        whole = query.shape[2] * sp
        unsupported = {
            "dropout": dropout > 0,
            "non-causal attention": is_causal is False or getattr(module, "is_causal", True) is False,
            f"a sliding window ({sliding_window}) shorter than the sequence ({whole})": sliding_window is not None
            and sliding_window < whole,
            "logit soft-capping": softcap is not None,
            "attention sinks": kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None,
        }
        for what, present in unsupported.items():
            if present:
                raise UnsupportedArchitecture(f"{model} uses {what} in attention, which sp={sp} does not support")
        calls[0] += 1
        head_dim = query.shape[-1]
        if scaling is not None and scaling != head_dim**-0.5:
            query = query * (scaling * head_dim**0.5)  # SDPA's default scale is 1/sqrt(head_dim)
        out = attention(query, key, value)  # [B, H, T/sp, D]
        return out.transpose(1, 2).contiguous(), None  # as transformers' attention functions return it

    return routed_attention
