"""Tensor parallelism's rules, checked before launch (`runner.layout`, `runner.sweep.tp_rules`), in-process."""

from __future__ import annotations

import itertools

import pytest

from runner.config import config_with, ffn_width
from runner.sweep.validate import config_problems


def _split(value: int, parts: int) -> bool:
    return value % parts == 0


@pytest.mark.parametrize(
    "world_size, sp, tp", [c for c in itertools.product((1, 2, 3, 4, 6, 8), (1, 2, 3), (1, 2, 3, 4)) if c[2] > 1]
)
def test_a_layout_with_tp_is_refused_exactly_when_a_split_is_uneven(world_size, sp, tp):
    """Generated over W, sp and tp with the tiny model (4 heads, d_model 64, seq_len 128, global batch 16):
    refused iff tp does not divide W, sp does not divide W / tp, the heads or the sequence do not split over
    sp x tp, the global batch does not split over dp x grad_accum, or the vocabulary (256) or the feed-forward
    width (192) does not split over tp; the field each rule names is refused."""
    cfg = config_with({"world_size": world_size, "sp": sp, "tp": tp, "grad_accum": 1, "train.global_batch": 16})
    fields = {field for field, _ in config_problems(cfg)}
    heads, seq_len = cfg.model.n_heads, cfg.train.seq_len
    expected = set() if _split(256, tp) and _split(ffn_width(cfg.model), tp) else {"tp"}
    if not _split(world_size, tp):
        expected.add("tp")
    elif not _split(world_size // tp, sp):
        expected.add("sp")
    else:
        if not _split(heads, sp * tp):
            expected.add("sp")
        if not _split(seq_len, sp * tp):
            expected.add("train.seq_len")
        if not _split(16, world_size // (sp * tp)):
            expected.add("train.global_batch")
    assert fields == expected, config_problems(cfg)


@pytest.mark.parametrize(
    "overrides, field, says",
    [
        ({"model.ffn_hidden": 75}, "tp", "the feed-forward width"),
        ({"model.vocab_size": 257}, "tp", "model.vocab_size=257"),
        ({"model.tie_embeddings": True}, "model.tie_embeddings", "column-parallel"),
        ({"reduction": "custom", "custom.fn": "runner.trainers.megatron:per_token"}, "tp", "reduction=custom"),
        ({"model.arch": "hf", "model.name": "hf_llama"}, "tp", "Hugging Face model"),
    ],
    ids=["ffn", "vocab", "tied", "custom", "hf"],
)
def test_what_tensor_parallelism_cannot_split_is_refused_naming_the_field(overrides, field, says):
    """(The heads' rule, which also splits d_model = heads x head_dim, is the layout's: the test above.)"""
    with_tp = config_with({"world_size": 4, "tp": 2, **overrides})
    said = [message for f, message in config_problems(with_tp) if f == field]
    assert any(says in message for message in said), config_problems(with_tp)
    without = config_with({"tp": 1, **overrides})
    assert not any(says in message for _, message in config_problems(without))
