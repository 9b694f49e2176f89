"""Models by architecture (`model.arch`), and what the rest of the runner asks of a model.

A model is an `nn.Module` that offers
    model(tokens [batch, seq], position_offset=int) -> logits [batch, seq, vocab]
        position_offset: the absolute position of column 0 (a sequence shard's start under sp);
    model.layers() -> the modules FSDP2 shards one by one (its decoder layers; the root is sharded too);
    model.use_attention(fn) -> route its attention through fn(q, k, v) with [batch, heads, seq, head_dim]
        tensors, k and v with as many heads or fewer (grouped-query attention) (Ulysses' all-to-all wrapper
        under sequence parallelism).
A builder makes one from the model config and the seed alone, so that every
rank builds bit-identical weights before sharding. To add an architecture:
a value of `runner.config.Architecture`, a builder here, a test against a
single-process reference (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn as nn

from runner.config import Architecture
from runner.model.decoder import AttentionFn, build_decoder
from runner.model.hf import build_hf


class LanguageModel(Protocol):
    def __call__(self, tokens: torch.Tensor, position_offset: int = 0) -> torch.Tensor: ...

    def layers(self) -> list[nn.Module]: ...

    def use_attention(self, attention: AttentionFn) -> None: ...


ARCHITECTURES: dict[Architecture, Callable[..., nn.Module]] = {
    Architecture.decoder: build_decoder,
    Architecture.hf: build_hf,  # transformers is imported when one is built
}


def build_model(cfg, seed: int) -> nn.Module:
    """The model of `cfg.arch`, its weights drawn from `seed` alone."""
    return ARCHITECTURES[Architecture(cfg.arch)](cfg, seed)
