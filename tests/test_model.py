"""The decoder: seed-determined weights, causal, and presets of the advertised size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from runner.config import ModelConfig
from runner.model.decoder import Decoder
from runner.model.registry import build_model

PRESETS = Path(__file__).resolve().parents[1] / "conf" / "model"


def preset(name: str):
    return OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(PRESETS / f"{name}.yaml"))


def test_weights_depend_on_the_seed_only():
    first, again, other = build_model(preset("tiny"), 5), build_model(preset("tiny"), 5), build_model(preset("tiny"), 6)
    for (name, a), b, c in zip(first.named_parameters(), again.parameters(), other.parameters()):
        assert torch.equal(a, b), name
        if a.dim() > 1:
            assert not torch.equal(a, c), name


def test_logits_at_a_position_ignore_later_tokens():
    model = build_model(preset("tiny"), 0)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % 256
    with torch.no_grad():
        torch.testing.assert_close(model(tokens)[:, :20], model(changed)[:, :20])
        assert not torch.allclose(model(tokens)[:, 20:], model(changed)[:, 20:])


def test_gpt2_preset_has_gpt2_small_size():
    with torch.device("meta"):
        model = Decoder(preset("gpt2_124m"))
    assert model.head.weight is model.embed.weight
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(124, rel=0.02)
