"""A run's mode label names every setting that changes its gradient rule, and the name people know a rule by;
job folders never hold a colon or whitespace, whatever the overrides."""

from __future__ import annotations

import itertools

from runner.config import config_with, job_dirname
from runner.modes import AutogradAllReduce, mode_label, run_mode_label

SETTINGS = {
    "custom.fn": ["runner.trainers.torchtitan:loss", "my_rules:loss"],
    "custom.name": [None, "torchtitan"],
    "custom.fsdp_reduce": ["mean", "sum"],
    "autograd_all_reduce": [a.value for a in AutogradAllReduce],
}


def test_custom_labels_tell_apart_every_setting_of_the_rule():
    labels = {}
    for values in itertools.product(*SETTINGS.values()):
        chosen = dict(zip(SETTINGS, values))
        label = run_mode_label(config_with({"reduction": "custom", **chosen}))
        if chosen["custom.name"] is None:
            assert label.startswith(f"custom:{chosen['custom.fn']} [FSDP {chosen['custom.fsdp_reduce']}")
        rule = (
            chosen["custom.name"] or chosen["custom.fn"],
            chosen["custom.fsdp_reduce"],
            chosen["autograd_all_reduce"],
        )
        labels.setdefault(label, set()).add(rule)
    assert all(len(rules) == 1 for rules in labels.values()), labels  # no two rules share a label
    assert run_mode_label(
        config_with({"reduction": "custom", "custom.name": "torchtitan", "custom.fsdp_reduce": "sum"})
    ) == ("torchtitan [FSDP sum]")


def test_builtin_labels_name_the_all_reduce_only_where_it_is_in_the_graph():
    assert mode_label("sum", "identity") == "sum[identity]" and mode_label("sum") == "sum"
    assert mode_label("local", "identity") == "local"  # local has no all-reduce in its graph
    assert run_mode_label(config_with({"reduction": "sum", "autograd_all_reduce": "torch_nn"})) == "sum[torch_nn]"
    assert mode_label("custom", custom_fn="m:f") == "custom:m:f"  # a record without the newer keys reads as before


def test_job_folder_names_hold_no_colon_or_whitespace():
    overrides = "custom.fn=my_rules:loss,custom.name=Megatron-LM (per-token),data.path=C:\\text\ttab/x.txt"
    name = job_dirname(overrides)
    assert not set(name) & set(":/\\ \t\n\r") and name.startswith("custom.fn=my_rules_loss,")
    long = job_dirname("custom.fn=a:b," + "x" * 300)
    assert len(long) < 170 and ":" not in long
