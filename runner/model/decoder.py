"""The runner's own Llama-style decoder (`model.arch=decoder`): RMSNorm, rotary positions, SwiGLU, causal SDPA.

Initialisation depends on the seed only, so every rank (and the single-process
reference of the tests) builds bit-identical weights before FSDP shards them.
It offers what `runner.model.registry` asks of a model: its layers, and a
hook for the attention function (Ulysses under sequence parallelism).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from runner.config import ModelConfig, ffn_width

# attention(q, k, v) with [batch, heads, seq, head_dim] tensors -> q's shape. k and v may have fewer heads
# (grouped-query attention: their count divides q's, and query head h reads key/value head h // (H / H_kv)).
AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape [seq, head_dim/2] for absolute `positions`."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head's features; x is [batch, seq, heads, head_dim]."""
    first, second = x.float().chunk(2, dim=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    rotated = torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
    return rotated.type_as(x)


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        batch, seq, _ = x.shape
        shape = (batch, seq, -1, self.head_dim)  # -1: n_heads, or n_heads / tp on a tensor-parallel rank
        q = apply_rotary(self.wq(x).view(shape), cos, sin)
        k = apply_rotary(self.wk(x).view(shape), cos, sin)
        v = self.wv(x).view(shape)
        out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.w_gate = nn.Linear(d_model, hidden, bias=False)
        self.w_up = nn.Linear(d_model, hidden, bias=False)
        self.w_down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, ffn_hidden: int):
        super().__init__()
        self.attention_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attention = Attention(cfg.d_model, cfg.n_heads)
        self.ffn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.ffn = SwiGLU(cfg.d_model, ffn_hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, attention)
        return x + self.ffn(self.ffn_norm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        ffn_hidden = ffn_width(cfg)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, ffn_hidden) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        # Plain causal attention unless `use_attention` replaces it (Ulysses for sp > 1).
        self.attention: AttentionFn = causal_attention

    def layers(self) -> list[nn.Module]:
        """The modules FSDP2 shards one by one (the root is sharded too)."""
        return list(self.blocks)

    def use_attention(self, attention: AttentionFn) -> None:
        self.attention = attention

    def forward(self, tokens: torch.Tensor, position_offset: int = 0) -> torch.Tensor:
        """Logits [batch, seq, vocab]; `position_offset` is the first token's absolute position."""
        positions = torch.arange(position_offset, position_offset + tokens.shape[1], device=tokens.device)
        cos, sin = rotary_cos_sin(positions, self.cfg.d_model // self.cfg.n_heads, self.cfg.rope_theta)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin, self.attention)
        return self.head(self.norm(x))


def build_decoder(cfg: ModelConfig, seed: int) -> Decoder:
    """Weights drawn from `seed` alone: N(0, init_std), residual outputs scaled by 1/sqrt(2 * n_layers)."""
    generator = torch.Generator().manual_seed(seed)
    model = Decoder(cfg)
    residual_outputs = {"attention.wo.weight", "ffn.w_down.weight"}
    for name, param in model.named_parameters():
        if param.dim() < 2:  # norm gains
            continue
        std = cfg.init_std
        if any(name.endswith(suffix) for suffix in residual_outputs):
            std /= math.sqrt(2 * cfg.n_layers)
        with torch.no_grad():
            param.copy_(torch.randn(param.shape, generator=generator) * std)
    return model
