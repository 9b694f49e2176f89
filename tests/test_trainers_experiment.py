"""`experiment=trainers`: one job per `layout=` and `trainer=` option (conf/layout/, conf/trainer/), each rule a distinct
mode with a stated expectation.

The options' math is tested in gloo worlds (tests/test_custom_reductions.py, tests/test_all_reduce.py);
here, that the experiment composes into the jobs it promises, each valid, named apart, and importable.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import run_module
from hydra import compose, initialize_config_dir

from runner.callables import callable_problem
from runner.config import register_configs, run_config_from
from runner.modes import custom_expectation, run_mode_label

CONF = Path(__file__).resolve().parents[1] / "conf"
register_configs()
# What each option's rule gives at W=2 GA=2 on padded documents (the gloo tests measure the same), as its mode
# label names it: the name people use, then the settings that change the rule.
EXPECTED = {
    "reference": ("sum", None),
    "identity": ("sum[identity]", None),
    "local": ("local", None),
    "hf_trainer": ("Hugging Face Trainer [FSDP mean]", 1.0),
    "hf_trainer_per_device": ("Hugging Face Trainer (average_tokens_across_devices=false) [FSDP mean]", "different"),
    "hf_trainer_no_loss_kwargs": ("Hugging Face Trainer (model_accepts_loss_kwargs=false) [FSDP mean]", "different"),
    "hf_trainer_ulysses": ("Hugging Face Trainer (DeepSpeed-Ulysses SP) [FSDP mean]", 1.0),  # sp=1: the default path
    "megatron": ("Megatron-LM (per-token) [FSDP sum]", 1.0),
    "megatron_default": ("Megatron-LM [FSDP mean]", "different"),
    "xtuner": ("xtuner (released) [FSDP mean]", 1.0),
    "xtuner_rfc": ("xtuner (RFC 1335, all-reduce dropped) [FSDP mean]", "1/W"),
    "xtuner_pr1968": ("xtuner (PR 1968) [FSDP sum]", 1.0),
    "xtuner_sample": ("xtuner (released, loss_reduction=sample) [FSDP mean]", "different"),
    "xtuner_square": ("xtuner (released, loss_reduction=square) [FSDP mean]", "different"),
    "torchtitan": ("torchtitan [FSDP sum]", 1.0),
    "sum_under_fsdp_sum": ("SUM-backward all-reduce under FSDP SUM (wrong) [FSDP sum]", "W"),
}
LAYOUTS = {  # layout= option: (world_size, sp, grad_accum, data.valid_tokens)
    "w2_ga2": (2, 1, 2, "full"),
    "w2_sp2_skewed": (2, 2, 1, "skewed"),
    "w4_sp2_one_empty": (4, 2, 2, "one_empty"),
}
# Where a rule's expectation depends on the layout (its preset says so with runner_if_equal):
# (trainer, layout) -> what it gives there.
BY_LAYOUT = {
    ("hf_trainer_per_device", "w2_sp2_skewed"): 1.0,  # dp = 1: the one rank's own count is N
    ("hf_trainer_ulysses", "w2_sp2_skewed"): 1.0,  # the SP path's mean of micro-batch means, of one micro-batch
    ("hf_trainer_ulysses", "w4_sp2_one_empty"): "different",
}


def composed(overrides: list[str], hydra_node: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides, return_hydra_config=hydra_node)


def test_every_trainer_option_is_a_distinct_valid_mode_with_its_expectation_at_every_layout():
    params = composed(["experiment=trainers"], hydra_node=True).hydra.sweeper.params
    trainers = params.trainer.split(",")
    assert trainers == list(EXPECTED) and params.layout.split(",") == list(LAYOUTS)
    assert len([t for t in trainers if t not in ("reference", "identity", "local")]) >= 10
    labels = set()
    for layout, shape in LAYOUTS.items():
        for trainer in trainers:
            cfg = run_config_from(composed(["experiment=trainers", f"layout={layout}", f"trainer={trainer}"]))
            assert (cfg.world_size, cfg.sp, cfg.grad_accum, cfg.data.valid_tokens.value) == shape
            label = run_mode_label(cfg)
            want_label, want_expectation = EXPECTED[trainer]
            assert label == want_label, trainer
            labels.add(label)
            if cfg.reduction.value == "custom":
                assert callable_problem(cfg.custom.fn) is None  # importable, (logits, labels, ctx), its hooks too
                want = BY_LAYOUT.get((trainer, layout), want_expectation)
                stated = custom_expectation(cfg.custom.expect, cfg.world_size)
                W = cfg.world_size
                assert stated == {"1/W": 1 / W, "W": float(W)}.get(want, want), (trainer, layout)
                assert cfg.custom.rule  # the trainers table's rule column
    assert len(labels) == len(EXPECTED)  # every rule its own mode


def test_a_trainer_option_alone_is_one_run_of_its_rule():
    """`python -m runner trainer=xtuner`: the rule on the default experiment's layout, nothing else changed."""
    default = run_config_from(composed([]))
    assert default.reduction.value == "sum" and default.custom.fn is None  # no trainer unless one is chosen
    for trainer, (want_label, _) in EXPECTED.items():
        cfg = run_config_from(composed([f"trainer={trainer}", "model=hf_llama"]))
        assert run_mode_label(cfg) == want_label, trainer
        assert (cfg.world_size, cfg.grad_accum, cfg.model.name) == (default.world_size, default.grad_accum, "hf_llama")


def test_every_trainer_rule_is_importable_from_any_working_directory(tmp_path):
    """The rules come with the installed package: the launcher's check finds each from a folder outside the repository."""
    specs = [
        run_config_from(composed([f"trainer={trainer}"])).custom.fn
        for trainer in EXPECTED
        if run_config_from(composed([f"trainer={trainer}"])).reduction.value == "custom"
    ]
    done = run_module("runner.callables", specs, tmp_path)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout.splitlines()[-1])
    assert {spec: facts[spec]["problem"] for spec in specs} == dict.fromkeys(specs)  # no problem with any of them
