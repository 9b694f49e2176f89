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


def test_runs_of_one_rule_whose_code_differed_get_labels_of_their_own():
    """One rule name, two versions of its file (edited between two sweeps): two labels, each with its code's hash;
    one version only: the label as before."""
    import pandas as pd

    from analysis.load.mode_labels import label_modes

    rule = {"reduction": "custom", "custom.fn": "my_rule:fn", "custom.name": "my rule"}
    runs = pd.DataFrame(
        [
            {**rule, "identity_custom_fn": "1a2b3c4d" + "0" * 56},
            {**rule, "identity_custom_fn": "1a2b3c4d" + "0" * 56},
            {**rule, "identity_custom_fn": "9f8e7d6c" + "0" * 56},
            {"reduction": "sum", "identity_custom_fn": None},
        ]
    )
    labels = label_modes(runs)["reduction"].tolist()
    assert labels[0] == labels[1] and labels[0].endswith(" (code 1a2b3c4)")
    assert labels[2].endswith(" (code 9f8e7d6)") and labels[2].removesuffix(" (code 9f8e7d6)") == labels[
        0
    ].removesuffix(" (code 1a2b3c4)")
    assert labels[3] == "sum"
    assert label_modes(runs.iloc[[0, 1, 3]])["reduction"].tolist()[0] == labels[0].removesuffix(" (code 1a2b3c4)")
