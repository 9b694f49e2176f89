"""The rules of tensor parallelism (`tp` > 1), checked before any rank starts.

The plan (`runner.model.tensor_parallel`) is written for the runner's own decoder: its column- and
row-parallel layers split the heads (so d_model), the feed-forward width and the vocabulary into tp equal
slices (the heads and the sequence are the layout's rules, `runner.layout`). The tied head would be one
parameter under two plans. The built-in modes are judged at tp > 1; a custom rule's collectives and counts
are written against groups of all W ranks (`runner.train.custom_rule`), which tp would silently change, so
it is refused.
"""

from __future__ import annotations

from omegaconf import DictConfig

from runner.model.hf_config import ModelShape

Problems = list[tuple[str, str]]


def _divides(tp: int, value: int, field: str) -> Problems:
    if value % tp == 0:
        return []
    higher = value + tp - value % tp  # not lower: a vocabulary must still hold the data's tokens
    return [
        ("tp", f"{field}={value} cannot be split into tp={tp} equal slices; use a multiple of {tp} (e.g. {higher})")
    ]


def tensor_parallel_problems(cfg: DictConfig, shape: ModelShape | None) -> Problems:
    tp = cfg.tp
    if tp == 1:
        return []
    if cfg.model.arch.value == "hf":
        return [
            (
                "tp",
                f"tp={tp} is built for the runner's own decoder (model=tiny, small or gpt2_124m); "
                f"model={cfg.model.name} is a Hugging Face model: use tp=1 with it",
            )
        ]
    found: Problems = []
    if cfg.reduction.value == "custom":
        found.append(
            (
                "tp",
                f"tp={tp} is judged for the built-in reduction modes only so far; reduction=custom (a trainer rule "
                "or your own callable) counts and reduces over groups of all W ranks: use tp=1 with it",
            )
        )
    if cfg.model.tie_embeddings:
        found.append(
            (
                "model.tie_embeddings",
                f"model.tie_embeddings=true with tp={tp}: the embedding is row-parallel and the head "
                "column-parallel, so one tied weight cannot follow both; use model.tie_embeddings=false",
            )
        )
    if shape is not None:
        found += _divides(tp, shape.ffn, "the feed-forward width (model.ffn_hidden, or its Llama rule)")
        found += _divides(tp, shape.vocab_size, shape.vocab_field)
    return found
