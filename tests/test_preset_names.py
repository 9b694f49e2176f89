"""A config group's choice is a preset conf/GROUP/ holds: a misspelt one is refused before Hydra composes, naming
the group, the closest presets and every preset (`runner.sweep.overrides`); a real one, alone or in a sweep, is
accepted. Generated over every group and preset: each preset with its last letter dropped (where that is not
itself a preset)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.sweep.overrides import config_groups, override_problems

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = sorted(config_groups() - {"hydra"})
PRESETS = {group: sorted(path.stem for path in (CONF / group).glob("*.yaml")) for group in GROUPS}
CASES = [(group, preset) for group in GROUPS for preset in PRESETS[group]]


def no_preset(args: list[str]) -> list[str]:
    """The refusals of a choice no preset holds (other refusals, such as a list of bugs without experiment=bugs,
    are other tests')."""
    return [message for _, message in override_problems(args) if "has no preset" in message]


@pytest.mark.parametrize("group, preset", CASES, ids=[f"{g}={p}" for g, p in CASES])
def test_a_preset_is_accepted_and_its_misspelling_refused_naming_it(group, preset):
    assert no_preset([f"{group}={preset}"]) == []
    others = [p for p in PRESETS[group] if p != preset]
    assert no_preset(["-m", f"{group}={','.join([preset, *others[:1]])}"]) == []  # a sweep of presets

    typo = preset[:-1]
    if typo in PRESETS[group] or not typo:
        return
    [message] = no_preset(["-m", f"{group}={preset},{typo}"])
    assert message.startswith(f"{group}={typo}: conf/{group}/ has no preset {typo}; did you mean ")
    assert preset in message.split("?")[0]  # among the closest names
    assert message.endswith(f"the presets: {', '.join(PRESETS[group])}")


def test_a_glob_and_an_added_config_folder_are_left_to_hydra():
    assert no_preset(["-m", "model=glob(*)"]) == []
    assert no_preset(["model=mine", "hydra.searchpath=[file:///elsewhere]"]) == []
    assert no_preset(["--config-dir", "/elsewhere", "model=mine"]) == []
    assert no_preset(["~model"]) == []  # deleting a group's choice is Hydra's to judge
    assert len(no_preset(["model=mine"])) == 1  # the same choice, with no folder added
