"""No size in a Hugging Face model's config reaches a rank and dies there: the rule of tests/test_ranges.py for
`model.overrides`.

Generated from the presets, not from a list: every integer key of each `model=hf_*` preset's config is tried
at -1, 0, 3 (odd, and no multiple of the heads) and a huge value. Each is either refused before launch with
its `model.overrides.KEY` named (the launcher's checks: the config rules, this machine's memory), or
accepted; every accepted config then runs its parts and one training step in a real two-rank gloo world,
which must finish without raising.
"""

from __future__ import annotations

import pytest
from gloo_world import run_in_world
from helpers import MODEL_PRESETS
from omegaconf import OmegaConf
from test_ranges import first_step_of_each, refusal

from runner.config import config_with

pytestmark = pytest.mark.slow

# Every Hugging Face preset that holds its whole config (model=hf alone has none).
PRESETS = sorted(
    path.stem
    for path in MODEL_PRESETS.glob("*.yaml")
    if OmegaConf.load(path).get("arch") == "hf" and OmegaConf.load(path).get("overrides")
)
BASE = {"train.steps": 1, "train.seq_len": 32, "train.global_batch": 8, "grad_accum": 2, "wandb.mode": "disabled"}
VALUES = (-1, 0, 3, 10**12)


def integer_keys(preset: str) -> list[str]:
    overrides = OmegaConf.load(MODEL_PRESETS / f"{preset}.yaml").overrides
    return [key for key, value in overrides.items() if isinstance(value, int) and not isinstance(value, bool)]


CASES = [(preset, key, value) for preset in PRESETS for key in integer_keys(preset) for value in VALUES]


def config_of(preset: str, key: str, value: int):
    cfg = config_with(BASE)
    cfg.model = OmegaConf.merge(cfg.model, OmegaConf.load(MODEL_PRESETS / f"{preset}.yaml"))
    OmegaConf.update(cfg, f"model.overrides.{key}", value, merge=False)
    return cfg


def case_id(preset: str, key: str, value: int) -> str:
    return f"{preset}-{key}={value}"


@pytest.fixture(scope="module")
def judged() -> tuple[dict, dict]:
    """(refusals, outcomes of the accepted configs' first steps), per case id."""
    refused, accepted = {}, []
    for case in CASES:
        cfg = config_of(*case)
        problems = refusal(cfg)
        if problems:
            refused[case_id(*case)] = problems
        else:
            accepted.append((case_id(*case), cfg))
    assert accepted  # some values are sizes a model can have: they must train
    return refused, run_in_world(first_step_of_each, 2, accepted, timeout_s=600)[0]


def test_every_size_of_the_presets_is_tried():
    assert {"hf_llama", "hf_qwen2"} <= set(PRESETS)
    assert {"hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size"} <= set(integer_keys("hf_llama"))


@pytest.mark.parametrize("preset, key, value", CASES, ids=[case_id(*case) for case in CASES])
def test_a_size_is_refused_naming_its_key_or_trains(judged, preset, key, value):
    refused, outcomes = judged
    case = case_id(preset, key, value)
    if case in refused:
        messages = " ".join(message for _, message in refused[case])
        assert f"model.overrides.{key}" in messages, f"{key}={value} refused without naming its key: {messages}"
    else:
        assert outcomes[case] in ("completed", "diverged")
