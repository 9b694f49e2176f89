"""Small builders shared by the tests."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from runner.config import RunConfig


def run_config(**dotted: object) -> DictConfig:
    """The typed default run config with `key=value` overrides (dots as in `train.seq_len`)."""
    cfg = OmegaConf.structured(RunConfig)
    for key, value in dotted.items():
        OmegaConf.update(cfg, key.replace("__", "."), value, merge=False)
    return cfg
