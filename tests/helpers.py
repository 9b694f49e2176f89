"""Small builders shared by the tests."""

from __future__ import annotations

from runner.config import RunConfig, config_with, rank_config


def run_config(**dotted: object) -> RunConfig:
    """The typed default run config, as a rank reads it, with `key=value` overrides (dots as in `train.seq_len`,
    or `__` for keyword arguments: `train__seq_len`)."""
    return rank_config(config_with({key.replace("__", "."): value for key, value in dotted.items()}))
