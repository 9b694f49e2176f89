"""A key given on the command line that a chosen preset also sets, to another value: refused, whichever wins.

A preset names what a job is: `trainer=NAME` its loss rule, `layout=NAME` its world, `bug=NAME` a known bug's
layout and arms, `bug_arm=NAME` which arm runs. Hydra merges a preset after the config groups chosen beside it
and before the command line's values, so an explicit choice is silently lost one way or the other:
`trainer=paper_grpo objective=ce` runs objective pg (the preset wins) in a folder named objective=ce, and
`-m experiment=trainers world_size=4` runs every job at W=4 (the value wins) in folders named layout=w2_ga2.
Either way a name would not say what ran; such a job is refused, naming the preset, the key and both values.

An experiment (`experiment=NAME`) is not such a preset: its values are defaults a command line may change
(`experiment=trainers train.steps=3`). Values a preset takes from other keys (`${known_bug.buggy.fn}`) are the
preset's own wiring, not a second setting.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from runner.ranges import value_at
from runner.sweep.rerun import flat_config

Problems = list[tuple[str, str]]
PRESET_GROUPS = ("trainer", "layout", "bug", "bug_arm")


@cache
def group_option_keys(conf: Path, group: str, option: str) -> dict:
    """The keys conf/GROUP/OPTION.yaml sets, dotted from the config's root ({} where there is no such file)."""
    path = conf / group / f"{option}.yaml"
    if not path.is_file():
        return {}
    text = path.read_text()
    config = OmegaConf.to_container(OmegaConf.create(text), resolve=False) or {}
    config.pop("defaults", None)
    config.pop("hydra", None)
    prefix = "" if "# @package _global_" in text else f"{group}."
    return {f"{prefix}{key}": value for key, value in flat_config(config).items() if key}


def _given(task_overrides: list[str], conf: Path) -> dict[str, tuple[object, str]]:
    """{dotted key: (value, the override that set it)} of the overrides that are neither presets nor Hydra's:
    `world_size=4` sets world_size; a group choice `objective=ce` sets every key of conf/objective/ce.yaml."""
    try:
        overrides = OverridesParser.create().parse_overrides(list(task_overrides))
    except HydraException:
        return {}
    groups = {path.name for path in conf.iterdir() if path.is_dir()}
    given = {}
    for text, override in zip(task_overrides, overrides):
        key = override.key_or_group
        if override.is_hydra_override() or override.is_sweep_override() or key in (*PRESET_GROUPS, "experiment"):
            continue
        if key in groups:
            for dotted, value in group_option_keys(conf, key, str(override.value())).items():
                given[dotted] = (value, text)
        else:
            given[key] = (override.value(), text)
    return given


def _same(a: object, b: object) -> bool:
    return a == b or str(a).lower() == str(b).lower()


def preset_conflicts(
    cfg: DictConfig, choices: dict | None, task_overrides: list[str] | None, *, conf: Path, besides: tuple = ()
) -> Problems:
    """For each preset of `choices` (Hydra's runtime choices), the keys it sets that `task_overrides` (the job's
    overrides as Hydra lists them) set to another value; `besides`: presets another message already explains."""
    given = _given(task_overrides or [], conf)
    problems = []
    for group in PRESET_GROUPS:
        option = (choices or {}).get(group)
        if not option or group in besides:
            continue
        for key, preset_value in group_option_keys(conf, group, str(option)).items():
            if key not in given or (isinstance(preset_value, str) and "${" in preset_value):
                continue
            value, override = given[key]
            if _same(value, preset_value):
                continue
            ran = value_at(cfg, key)
            ran = getattr(ran, "value", ran)
            outcome = (
                f"the preset's value would win and {override} would not act; give one of them (drop {override}, "
                f"or choose another {group})"
                if _same(ran, preset_value)
                else f"{override} would win and the job would not be {group}={option} as its folder and run name "
                f"say; give one of them (drop {override}, or drop {group}={option})"
            )
            problems.append(
                (key, f"{group}={option} sets {key}={preset_value} and {override} sets it to {value}: {outcome}")
            )
    return problems
