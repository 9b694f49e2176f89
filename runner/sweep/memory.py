"""A rank's memory, estimated from the config before launch, so a config too big for the machine is refused
with the fields that make it big instead of dying in a rank (out of memory, or the kernel's OOM killer).

Per CPU rank of the runner's own decoder, in bytes (W ranks, dp x sp of them,
M micro-batches; P parameters; B = train.global_batch, T = train.seq_len):

    parameters   16 P / W          sharded fp32 weights, gradients and AdamW's two moments
                 + 4 P_layer + 4 P_root   one decoder layer and the root (embedding, head) unsharded in use
    sketch       8 K P / W         metrics.sketch_dim projections of this rank's shard, float64
    batches      32 B T            every rank draws the whole global batch: inputs and labels, int64, and a copy
    activations  b t (12 V + 4 L (10 d + 3 f)) + 4 b (H / sp) T^2    for b = B / (dp M) sequences of t = T / sp
                 positions: logits with their float copy and gradient, what each layer keeps for backward,
                 and attention's scores over the whole sequence (Ulysses gathers it)

An estimate, not a bound: it refuses only what clearly cannot fit (over
`BUDGET` of the machine's memory, shared by its ranks); what it lets through may
still be slow.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig

from runner.config import ffn_width
from runner.layout import ParallelLayout

BUDGET = 0.8  # of the machine's memory, shared by the ranks started on it
GIB = 2**30


def machine_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def rank_memory(cfg: DictConfig) -> list[tuple[float, str, list[str]]]:
    """(bytes, what, the fields that set it) per part of one rank's memory (the module docstring's formula)."""
    model, layout = cfg.model, ParallelLayout.from_config(cfg)
    d, layers, vocab, heads, ffn = model.d_model, model.n_layers, model.vocab_size, model.n_heads, ffn_width(model)
    per_layer = 4 * d * d + 3 * d * ffn + 2 * d
    root = vocab * d * (1 if model.tie_embeddings else 2) + d
    params = layers * per_layer + root
    world, batch, seq = layout.world_size, cfg.train.global_batch, cfg.train.seq_len
    rows = max(1, batch // (layout.dp * layout.grad_accum))
    chunk = seq // layout.sp
    model_fields = ["model.n_layers", "model.d_model", "model.vocab_size", "model.ffn_hidden"]
    activations = (
        rows * chunk * (12 * vocab + 4 * layers * (10 * d + 3 * ffn)) + 4 * rows * (heads // layout.sp) * seq**2
    )
    return [
        (16 * params / world + 4 * (per_layer + root), "the model, its gradients and AdamW's moments", model_fields),
        (
            8 * cfg.metrics.sketch_dim * params / world,
            "the gradient sketch's projections",
            ["metrics.sketch_dim", *model_fields],
        ),
        (32 * batch * seq, "the global batch of a step", ["train.global_batch", "train.seq_len"]),
        (activations, "the activations of one micro-batch", ["train.seq_len", "train.global_batch", *model_fields]),
    ]


def memory_problems(cfg: DictConfig, *, ranks_here: int, machine_bytes: int) -> list[tuple[str, str]]:
    """A problem when one CPU rank's estimated memory exceeds its share of this machine's."""
    parts = rank_memory(cfg)
    need = sum(size for size, _, _ in parts)
    share = BUDGET * machine_bytes / max(1, ranks_here)
    if need <= share:
        return []
    size, what, fields = max(parts)
    settings = ", ".join(f"{name}={_value(cfg, name)}" for name in fields)
    return [
        (
            fields[0],
            f"one rank would need about {need / GIB:,.1f} GiB, most of it ({size / GIB:,.1f} GiB) for {what} "
            f"({settings}); this machine gives each of its {ranks_here} rank(s) about {share / GIB:,.1f} GiB: "
            f"lower {' or '.join(fields[:2])}",
        )
    ]


def _value(cfg: DictConfig, dotted: str) -> object:
    for part in dotted.split("."):
        cfg = cfg[part]
    return cfg
