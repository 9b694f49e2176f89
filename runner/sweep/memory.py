"""A rank's memory, estimated from the config before launch, so a config too big for the machine is refused
with the fields that make it big instead of dying in a rank (out of memory, or the kernel's OOM killer).

Per CPU rank of the runner's own decoder, in bytes (W ranks, dp x sp x tp x pp of them,
S = (W / dp_replicate) of them sharing one copy of the model (W without HSDP; a tensor-parallel rank
holds 1/tp of it and a pipeline stage 1/pp), M micro-batches; P parameters, L layers (a stage's
-(-L // pp) of them); B = train.global_batch, T = train.seq_len):

    parameters   16 P / S          sharded fp32 weights, gradients and AdamW's two moments
                 + 4 P_layer + 4 P_root   one decoder layer and the root (embedding, head) unsharded in use
    sketch       8 K P / S         metrics.sketch_dim projections of this rank's shard, float64
    batches      32 B T            every rank draws the whole global batch: inputs and labels, int64, and a copy
    activations  b t (12 V + 4 L (10 d + 3 f)) + 4 b (H / sp) T^2    for b = B / (dp M) sequences of t = T / sp
                 positions: logits with their float copy and gradient, what each layer keeps for backward,
                 and attention's scores over the whole sequence (Ulysses gathers it)

A Hugging Face model (`model.arch=hf`) is sized by the same formula from its
config's layers, width, feed-forward width and vocab (`runner.model.hf_config`).

An estimate, not a bound: it refuses only what clearly cannot fit (over
`BUDGET` of the machine's memory, shared by its ranks); what it lets through may
still be slow.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig

from runner.layout import ParallelLayout
from runner.model.hf_config import HFConfigError, model_shape

BUDGET = 0.8  # of the machine's memory, shared by the ranks started on it
GIB = 2**30


def machine_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def rank_memory(cfg: DictConfig) -> list[tuple[float, str, list[str]]]:
    """(bytes, what, the fields that set it) per part of one rank's memory (the module docstring's formula).

    A Hugging Face model is sized from its config (`runner.model.hf_config.model_shape`) by the same formula;
    an unreadable one has no parts (the config rules refuse it).
    """
    try:
        shape = model_shape(cfg.model)
    except HFConfigError:
        return []
    layout = ParallelLayout.from_config(cfg)
    d, layers, vocab, heads, ffn = shape.width, shape.layers, shape.vocab_size, shape.heads, shape.ffn
    per_layer = 4 * d * d + 3 * d * ffn + 2 * d
    root = vocab * d * (1 if shape.tied else 2) + d
    params = layers * per_layer + root
    # A pipeline stage holds about 1/pp of the model, and the activations of its own layers (the longest
    # stage's: -(-layers // pp)) for all the pipeline micro-batches of one micro-batch (GPipe's worst case).
    shards, batch, seq = max(1, layout.fsdp_shards * layout.tp * layout.pp), cfg.train.global_batch, cfg.train.seq_len
    stage_layers = -(-layers // layout.pp)
    rows = max(1, batch // (layout.dp * layout.grad_accum))
    chunk = seq // layout.sp
    model_fields = [name for name, _ in shape.size_fields]
    sharding = ["dp_replicate"] if layout.replicated else []  # more replicas, bigger shards
    activations = (
        rows * chunk * (12 * vocab + 4 * stage_layers * (10 * d + 3 * ffn)) + 4 * rows * (heads // layout.sp) * seq**2
    )
    return [
        (
            16 * params / shards + 4 * (per_layer + root),
            "the model, its gradients and AdamW's moments",
            [*model_fields, *sharding],
        ),
        (
            8 * cfg.metrics.sketch_dim * params / shards,
            "the gradient sketch's projections",
            ["metrics.sketch_dim", *model_fields, *sharding],
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
    if dotted.startswith("model.overrides."):  # a Hugging Face config's key: the config file's value, or its override
        return dict(model_shape(cfg.model).size_fields)[dotted]
    for part in dotted.split("."):
        cfg = cfg[part]
    return cfg
