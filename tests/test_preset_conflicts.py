"""A key given beside a preset that sets it (trainer=, layout=, bug=, bug_arm=) to another value is refused before
launch, whichever of the two Hydra lets win; the same value, or a key the preset leaves alone, is not.

Generated from conf/: every preset and every key a preset sets (each at least once), set by a value override
(which wins over the preset) and, where the key is a config group's, by a group choice (which the preset wins
over). A few cases go through the CLI's own steps (`cli_verdict`) and one through a real launch.
"""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from runner.config import register_configs
from runner.sweep.overrides import CONF
from runner.sweep.preset_conflicts import PRESET_GROUPS, group_option_keys, preset_conflicts
from runner.sweep.validate import EXIT_INVALID
from tests.helpers import cli_verdict, run_module
from tests.schema_values import another_value, leaves

SCHEMA = leaves()


def _cli_value(kind: type, value) -> str:
    other = another_value(kind, value)
    if kind is str:
        return "another_value"  # no quoting needed in Hydra's grammar
    other = getattr(other, "value", other)
    return str(other).lower() if isinstance(other, bool) else str(other)


def cases() -> list[tuple[str, str, str, str]]:
    """(group, option, key, value override) covering every preset and every (group, key) a preset sets."""
    chosen, covered = [], set()
    for group in PRESET_GROUPS:
        for path in sorted((CONF / group).glob("*.yaml")):
            keys = {
                key: value
                for key, value in group_option_keys(CONF, group, path.stem).items()
                if key in SCHEMA and not (isinstance(value, str) and "${" in value)
            }
            new = [key for key in keys if (group, key) not in covered] or list(keys)[:1]
            for key in new:
                covered.add((group, key))
                chosen.append((group, path.stem, key, f"{key}={_cli_value(SCHEMA[key], keys[key])}"))
    return chosen


def conflicts(overrides: list[str]) -> list[tuple[str, str]]:
    cfg = compose("config", overrides, return_hydra_config=True)
    return preset_conflicts(
        OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]),
        dict(cfg.hydra.runtime.choices),
        list(cfg.hydra.overrides.task),
        conf=CONF,
    )


def test_every_preset_key_given_otherwise_is_refused_and_the_same_value_is_not():
    generated = cases()
    assert {option for _, option, _, _ in generated} >= {"paper_grpo", "w2_ga2", "double_ga_scaling", "buggy"}
    assert len(generated) > 40
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for group, option, key, override in generated:
            found = dict(conflicts([f"{group}={option}", override]))
            assert key in found, (group, option, override, found)
            assert found[key].startswith(f"{group}={option} sets {key}=") and "would win and the job" in found[key]
            preset_value = group_option_keys(CONF, group, option)[key]
            text = str(preset_value).lower() if isinstance(preset_value, bool) else str(preset_value)
            same = f"{key}='{text}'" if isinstance(preset_value, str) else f"{key}={text}"  # as a command line gives it
            if "'" not in text:
                assert key not in dict(conflicts([f"{group}={option}", same])), (group, option, same)
        assert conflicts(["layout=w2_ga2", "train.steps=3", "optim.lr=0.001"]) == []  # keys it leaves alone
        assert conflicts(["experiment=trainers", "world_size=4"]) == []  # an experiment's values are defaults


def test_a_group_choice_the_preset_overrides_is_refused_as_not_acting():
    register_configs()
    groups = {path.name for path in CONF.iterdir() if path.is_dir()}
    found_any = 0
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for group in PRESET_GROUPS:
            for path in sorted((CONF / group).glob("*.yaml")):
                for key, value in group_option_keys(CONF, group, path.stem).items():
                    chosen_group = key.split(".")[0]
                    if chosen_group not in groups or chosen_group in PRESET_GROUPS or "${" in str(value):
                        continue
                    others = [
                        option.stem
                        for option in sorted((CONF / chosen_group).glob("*.yaml"))
                        if key in group_option_keys(CONF, chosen_group, option.stem)
                        and group_option_keys(CONF, chosen_group, option.stem)[key] != value
                    ]
                    for other in others[:1]:
                        found = dict(conflicts([f"{group}={path.stem}", f"{chosen_group}={other}"]))
                        assert f"{chosen_group}={other} would not act" in found.get(key, ""), (path, other, found)
                        found_any += 1
    assert found_any >= 5  # post-training trainers (objective=ce), a bug's optimizer (optim=...)


def test_the_cli_refuses_both_directions_before_any_rank():
    lost = cli_verdict(["trainer=paper_grpo", "objective=ce"])
    assert lost.code == EXIT_INVALID and lost.status == "invalid"
    assert (
        "trainer=paper_grpo sets objective.name=pg and objective=ce sets it to ce: the preset's value" in lost.message
    )
    renamed = cli_verdict(["layout=w2_ga2", "world_size=4"])
    assert "layout=w2_ga2 sets world_size=2 and world_size=4 sets it to 4: world_size=4 would win" in renamed.message
    assert cli_verdict(["layout=w2_ga2", "world_size=2"]).code == 0


def test_a_sweep_of_layouts_with_a_world_size_is_refused_before_any_job(tmp_path):
    # world_size=8 is none of the three layouts' worlds: every job refused, none started
    done = run_module(
        "runner",
        ["-m", "experiment=trainers", "trainer=reference", "world_size=8", f"hydra.sweep.dir={tmp_path / 's'}"],
        tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == EXIT_INVALID, output[-3000:]
    for layout, world in (("w2_ga2", 2), ("w2_sp2_skewed", 2), ("w4_sp2_one_empty", 4)):
        assert f"layout={layout} sets world_size={world} and world_size=8 sets it to 8" in output
    assert not list((tmp_path / "s").glob("*/logs"))


def test_a_list_of_bugs_needs_experiment_bugs_and_an_arm_its_bug():
    from runner.sweep.overrides import override_problems

    listed = dict(override_problems(["-m", "bug=double_ga_scaling,ga_mean_of_means"]))
    assert listed["bug"].startswith(
        "bug=double_ga_scaling,ga_mean_of_means sweeps known bugs only with experiment=bugs"
    )
    assert override_problems(["-m", "experiment=bugs", "bug=double_ga_scaling,ga_mean_of_means"]) == []
    assert override_problems(["-m", "bug=double_ga_scaling"]) == []  # one bug: its three arms
    armed = cli_verdict(["bug_arm=buggy"])
    assert armed.code == EXIT_INVALID and "bug_arm=buggy picks an arm of a known bug: give the bug too" in armed.message
    assert cli_verdict(["bug=double_ga_scaling", "bug_arm=fixed"]).code == 0
