"""`experiment=trainers`: one job per `trainer=` option (conf/trainer/), each a distinct mode with a stated expectation.

The options' math is tested in gloo worlds (tests/test_custom_reductions.py, tests/test_all_reduce.py);
here, that the experiment composes into the jobs it promises, each valid, named apart, and importable.
"""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from runner.callables import callable_problem
from runner.config import register_configs, run_config_from
from runner.modes import custom_expectation, mode_label

CONF = Path(__file__).resolve().parents[1] / "conf"
register_configs()
# What each option's rule gives at W=2 on padded documents (the gloo tests measure the same).
EXPECTED = {
    "reference": ("sum", None),
    "torch_nn": ("sum[torch_nn]", None),
    "identity": ("sum[identity]", None),
    "hf_trainer": ("custom:examples.reductions.hf_trainer:loss", 1.0),
    "hf_trainer_per_device": ("custom:examples.reductions.hf_trainer:loss_per_device", "different"),
    "xtuner": ("custom:examples.reductions.xtuner:loss", 1.0),
    "xtuner_pr1968": ("custom:examples.reductions.xtuner:loss_pr1968", 1.0),
    "torchtitan": ("custom:examples.reductions.torchtitan:loss", 1.0),
    "megatron": ("custom:examples.reductions.megatron:loss", 1.0),
}


def composed(overrides: list[str], hydra_node: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides, return_hydra_config=hydra_node)


def test_every_trainer_option_is_a_distinct_valid_mode_with_its_expectation():
    params = composed(["experiment=trainers"], hydra_node=True).hydra.sweeper.params
    trainers = params.trainer.split(",")
    assert trainers == list(EXPECTED)
    for trainer in trainers:
        cfg = run_config_from(composed(["experiment=trainers", f"trainer={trainer}"]))
        assert (cfg.world_size, cfg.grad_accum) == (2, 2)
        label = mode_label(cfg.reduction.value, cfg.autograd_all_reduce.value, cfg.custom.fn)
        want_label, want_expectation = EXPECTED[trainer]
        assert label == want_label, trainer
        if cfg.reduction.value == "custom":
            assert callable_problem(cfg.custom.fn) is None  # importable from the repository root, (logits, labels, ctx)
            assert custom_expectation(cfg.custom.expect, cfg.world_size) == want_expectation
            assert cfg.custom.rule  # the trainers table's rule column
            fsdp = {"xtuner_pr1968": "sum", "torchtitan": "sum", "megatron": "sum"}.get(trainer, "mean")
            assert cfg.custom.fsdp_reduce.value == fsdp, trainer


def test_a_trainer_option_alone_is_one_run_of_its_rule():
    """`python -m runner trainer=xtuner`: the rule on the default experiment's layout, nothing else changed."""
    default = run_config_from(composed([]))
    assert default.reduction.value == "sum" and default.custom.fn is None  # no trainer unless one is chosen
    for trainer, (want_label, _) in EXPECTED.items():
        cfg = run_config_from(composed([f"trainer={trainer}", "model=hf_llama"]))
        assert mode_label(cfg.reduction.value, cfg.autograd_all_reduce.value, cfg.custom.fn) == want_label, trainer
        assert (cfg.world_size, cfg.grad_accum, cfg.model.name) == (default.world_size, default.grad_accum, "hf_llama")
