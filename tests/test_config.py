"""Config composition through Hydra's compose API: accepted override lists and rejected ones.

The kinds of bad input docs/command-line.md lists are the cases of tests/test_refusals.py;
these are the further rules, checked in-process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from runner.config import register_configs, run_config_from
from runner.sweep.validate import InvalidConfig, validate

CONF = Path(__file__).resolve().parents[1] / "conf"
register_configs()


def composed(overrides: list[str], hydra_node: bool = False) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides, return_hydra_config=hydra_node)


def error_chain(error: BaseException) -> str:
    messages = []
    while error is not None:
        messages.append(str(error))
        error = error.__cause__ or error.__context__
    return "\n".join(messages)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            [],
            {
                "reduction": "sum",
                "world_size": 2,
                "grad_accum": 2,
                "sp": 1,
                "dp_replicate": 1,
                "model.d_model": 64,
                "optim.clip": 1.0,
            },
        ),
        (["model=small"], {"model.n_layers": 4, "model.d_model": 256, "model.n_heads": 8}),
        (["model=gpt2_124m"], {"model.n_layers": 12, "model.d_model": 768, "model.vocab_size": 50304}),
        (["optim=sgd"], {"optim.name": "sgd", "optim.clip": 0.0, "optim.momentum": 0.9}),
        (["reduction=mean_of_means", "world_size=4", "grad_accum=4"], {"reduction": "mean_of_means", "world_size": 4}),
        (
            [
                "train.steps=5",
                "train.seq_len=64",
                "optim.lr=1e-3",
                "optim.clip=0.5",
                "wandb.mode=disabled",
            ],
            {"train.steps": 5, "train.seq_len": 64, "optim.lr": 1e-3, "optim.clip": 0.5, "wandb.mode": "disabled"},
        ),
        (["experiment=sgd"], {"optim.name": "sgd", "grad_accum": 2}),
        (["seed=7", "device=cpu"], {"seed": 7, "device": "cpu"}),
        (["world_size=4", "sp=2"], {"world_size": 4, "sp": 2}),
        (["world_size=4", "sp=4", "grad_accum=1"], {"sp": 4}),
        (["model=hf_llama"], {"model.arch": "hf", "model.overrides.num_key_value_heads": 2, "model.config": None}),
        (["model=hf_qwen2", "model.overrides.hidden_size=128"], {"model.overrides.tie_word_embeddings": True}),
        # Keys the preset does not have are added (the overrides node is open, the rest of the config strict):
        (
            ["model=hf_llama", "model.overrides.rope_parameters.rope_theta=5e5"],
            {"model.overrides.rope_parameters.rope_theta": 5e5},
        ),
        (["model=hf_llama", "world_size=4", "sp=4", "grad_accum=1"], {"sp": 4}),
        (["world_size=4", "dp_replicate=2"], {"dp_replicate": 2}),  # HSDP: 2 replicas of 2 shards
        (["world_size=4", "grad_accum=1", "dp_replicate=4"], {"dp_replicate": 4}),  # DDP
        (["world_size=4", "sp=2", "dp_replicate=2"], {"dp_replicate": 2, "sp": 2}),  # 2 replicas of 1 dp rank x sp 2
    ],
)
def test_accepted_overrides(overrides, expected):
    cfg = run_config_from(composed(overrides))
    validate(cfg)
    for key, value in expected.items():
        got = cfg
        for part in key.split("."):
            got = got[part]
        assert (got.value if hasattr(got, "value") else got) == value, key


def test_a_users_hf_config_with_added_overrides(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        '{"model_type": "mistral", "architectures": ["MistralForCausalLM"], "num_attention_heads": 8, "vocab_size": 32000}'
    )
    cfg = run_config_from(composed(["model=hf", f"model.config={path}", "model.overrides.num_hidden_layers=2"]))
    validate(cfg)
    assert dict(cfg.model.overrides) == {"num_hidden_layers": 2}
    with pytest.raises(
        InvalidConfig, match="with model.overrides: num_attention_heads='two' must be a positive integer"
    ):
        validate(
            run_config_from(composed(["model=hf", f"model.config={path}", "model.overrides.num_attention_heads=two"]))
        )


def test_experiment_presets_set_the_sweep():
    default = composed([], hydra_node=True).hydra.sweeper.params
    assert default.reduction.split(",") == ["sum", "local", "detached", "fsdp_sum", "scaled", "mean_of_means"]
    grid = composed(["experiment=grid"], hydra_node=True).hydra.sweeper.params
    assert grid.world_size == "1,2,4" and grid.grad_accum == "1,4"


def test_user_text_file_is_accepted(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("one paragraph\n\nanother one\n")
    cfg = run_config_from(composed(["data=text", f"data.path={text}"]))
    validate(cfg)
    assert cfg.data.path == str(text)


@pytest.mark.parametrize(
    "overrides, names",
    [
        (["wandb.mode=cloud"], ["wandb.mode", "offline"]),
        (["mp.param_dtype=fp8"], ["mp.param_dtype", "bfloat16"]),
    ],
)
def test_composition_rejects(overrides, names):
    with pytest.raises(Exception) as caught:
        run_config_from(composed(overrides))
    message = error_chain(caught.value)
    for name in names:
        assert name in message


@pytest.mark.parametrize(
    "overrides, field, hint",
    [
        (["sp=0"], "sp", ">= 1"),
        (["world_size=4", "sp=2", "grad_accum=3"], "train.global_batch", "dp * grad_accum = 2 * 3 = 6"),
        (["world_size=4", "train.global_batch=10"], "train.global_batch", "multiple of 8"),
        (["model.d_model=65"], "model.d_model", "use a multiple of 8 (e.g. 64 or 72)"),
        (["model.d_model=12", "model.n_heads=4"], "model.d_model", "heads of an even size"),
        (["model.vocab_size=100"], "model.vocab_size", ">= 256"),
        (["model=hf_llama", "model.overrides.num_attention_heads=0"], "model.overrides", "must be a positive integer"),
        (["model=hf_llama", "model.overrides.architectures=[LlamaModel]"], "model.config", "not a causal LM"),
        (["model=hf_llama", "model.n_layers=4"], "model.n_layers", "set its key instead, e.g. model.overrides"),
        (["model=tiny", "model.overrides.num_hidden_layers=4"], "model.overrides", "is for model.arch=hf"),
        (["model=hf_llama", "train.seq_len=8192"], "train.seq_len", "exceeds the model's max_position_embeddings=4096"),
        (
            # the valid key/value heads of 10^12 query heads: its 169 divisors, found in sqrt(10^12) steps, not 10^12
            [
                "model=hf_llama",
                "model.overrides.num_attention_heads=1000000000000",
                "model.overrides.num_key_value_heads=3",
            ],
            "model.overrides",
            "valid num_key_value_heads: 1, 2, 4, 5, 8, 10,",
        ),
        (["metrics.sketch_dim=-1"], "metrics.sketch_dim", ">= 0"),
        (["metrics.gather_every=0"], "metrics.gather_every", ">= 1"),
        (["wandb.log_every=0"], "wandb.log_every", ">= 1"),
        (["fault.kind=raise", "fault.rank=2"], "fault.rank", "valid: 0 to 1"),
        (["fault.kind=exit", "fault.step=61"], "fault.step", "valid: 1 to 60"),
        (["fault.kind=nan", "experiment=cost"], "fault.kind", "a cost job (cost.modes) injects no fault"),
        (["dist.timeout_s=0"], "dist.timeout_s", "> 0"),
        (["dp_replicate=0"], "dp_replicate", "dp_replicate=0 must be >= 1"),
        (
            ["world_size=4", "dp_replicate=3"],
            "dp_replicate",
            "dp_replicate=3 does not divide dp = world_size / sp = 4 / 1 = 4 (the replicas split the dp ranks "
            "evenly); valid dp_replicate: 1, 2, 4",
        ),
        (["world_size=4", "sp=2", "dp_replicate=4"], "dp_replicate", "= 4 / 2 = 2 (the replicas split"),
        (["dp_replicate=1000000000000"], "dp_replicate", "valid dp_replicate: 1, 2"),
    ],
)
def test_validation_rejects_with_field_and_hint(overrides, field, hint):
    cfg = run_config_from(composed(overrides))
    with pytest.raises(InvalidConfig) as caught:
        validate(cfg)
    assert field in [name for name, _ in caught.value.problems]
    assert f"{field}" in str(caught.value) and hint in str(caught.value)


def test_online_wandb_needs_a_key(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    with pytest.raises(InvalidConfig, match=r"wandb\.mode=online needs WANDB_API_KEY .*make sync"):
        validate(run_config_from(composed(["wandb.mode=online"])))
    monkeypatch.setenv("WANDB_API_KEY", "local-0123456789abcdef")
    validate(run_config_from(composed(["wandb.mode=online"])))


def test_the_memory_estimate_sizes_a_hugging_face_model_by_its_config():
    """hf_llama is `tiny`'s size (2 fewer k/v heads aside); a huge override is refused naming the HF keys."""
    from runner.sweep.machine import machine_problems
    from runner.sweep.memory import rank_memory

    own, hf = (sum(size for size, _, _ in rank_memory(run_config_from(composed(o)))) for o in ([], ["model=hf_llama"]))
    assert hf == pytest.approx(own, rel=0.05)
    huge = run_config_from(
        composed(
            [
                "model=hf_llama",
                "model.overrides.hidden_size=16384",
                "model.overrides.num_hidden_layers=64",
                "metrics.sketch_dim=0",
            ]
        )
    )
    ((field, message),) = machine_problems(huge, cuda_devices=0, cpu_cores=2, machine_bytes=24 * 2**30)
    assert field == "model.overrides.num_hidden_layers"
    assert "model.overrides.num_hidden_layers=64, model.overrides.hidden_size=16384" in message
