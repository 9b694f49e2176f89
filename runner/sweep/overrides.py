"""The command line's overrides, checked against the config schema before Hydra composes anything.

Hydra refuses an unknown key (`reductions=sum`) with the advice to add it as
`+reductions=sum`, which the runner's fixed schema cannot take either; here both
get one message naming the key and the closest valid ones. A value that starts
with `~` (a home path: `data.path=~/corpus.txt`) is quoted first, since Hydra's
override grammar reads a bare `~` as its delete operator; the runner expands it.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path
from typing import get_origin, get_type_hints

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from runner.config import RunConfig
from runner.ranges import unoptional

CONF = Path(__file__).resolve().parents[2] / "conf"
_HOME_VALUE = re.compile(r"^([+]{0,2}[\w.]+)=(~[^'\",\[\]]*)$")


def quote_home_paths(args: list[str]) -> list[str]:
    """`key=~/path` becomes `key='~/path'`, which Hydra reads as the string `~/path`."""
    return [_HOME_VALUE.sub(r"\1='\2'", arg) for arg in args]


def schema_keys(cls: type = RunConfig, prefix: str = "") -> tuple[set[str], set[str]]:
    """(every dotted key of the schema, the keys whose values are free-form dicts: any sub-key is valid)."""
    keys, open_keys = set(), set()
    hints = get_type_hints(cls)
    for field in dataclasses.fields(cls):
        key, kind = f"{prefix}{field.name}", unoptional(hints[field.name])
        keys.add(key)
        if dataclasses.is_dataclass(kind):
            inner, inner_open = schema_keys(kind, f"{key}.")
            keys |= inner
            open_keys |= inner_open
        elif get_origin(kind) is dict or kind is dict:
            open_keys.add(key)
    return keys, open_keys


def config_groups() -> set[str]:
    """Hydra's config groups of this project (`model=small` picks a preset), from conf/."""
    return {path.name for path in CONF.iterdir() if path.is_dir()}


def override_problems(args: list[str]) -> list[tuple[str, str]]:
    """(key, message) for every override of a key the schema does not have; [] when Hydra's grammar
    rejects an override (Hydra then says where)."""
    candidates = [arg for arg in args if "=" in arg and not arg.startswith("-")]
    try:
        overrides = OverridesParser.create().parse_overrides(candidates)
    except HydraException:
        return []
    keys, open_keys = schema_keys()
    groups = config_groups()
    found = []
    for override in overrides:
        key = override.key_or_group
        if override.is_hydra_override() or key in keys or key in groups or key.split("/")[0] in groups:
            continue
        if any(key.startswith(f"{open_key}.") for open_key in open_keys):
            continue
        close = difflib.get_close_matches(key, sorted(keys | groups), n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        found.append(
            (
                key,
                f"{key} is not a config key of the runner; {hint}"
                "`python -m runner --help` lists the keys, and `python -m runner --cfg job` shows them all "
                "(the schema is fixed: a `+` cannot add keys to it)",
            )
        )
    return found + _preset_problems(args, overrides, groups) + _known_bug_problems(candidates, overrides)


def _preset_problems(args: list[str], overrides: list, groups: set[str]) -> list[tuple[str, str]]:
    """`model=hf_lama`: a choice of a config group that conf/GROUP/ has no preset for, with the closest names.
    Left to Hydra where a search path or config folder is added (it may hold more presets) and for glob sweeps."""
    if any(arg.startswith(("hydra.searchpath", "--config-dir", "-cd", "--config-path", "-cp")) for arg in args):
        return []
    found = []
    for override in overrides:
        group = override.key_or_group
        if group not in groups or group == "hydra" or override.is_delete():
            continue
        try:
            values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
        except HydraException:  # a glob: Hydra matches it against the presets itself
            continue
        presets = sorted(path.stem for path in (CONF / group).glob("*.yaml"))
        for value in (v for v in values if isinstance(v, str) and v not in presets):
            close = difflib.get_close_matches(value, presets, n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            found.append(
                (
                    group,
                    f"{group}={value}: conf/{group}/ has no preset {value}; {hint}the presets: {', '.join(presets)}",
                )
            )
    return found


def _known_bug_problems(args: list[str], overrides: list) -> list[tuple[str, str]]:
    """`bug=` and `bug_arm=` as the known bugs' configs can take them: a list of bugs only under experiment=bugs
    (alone, `-m bug=NAME` sweeps that bug's arms; a list leaves the default experiment's sweep of modes), and an
    arm only with its bug."""
    given = {override.key_or_group: (arg, override) for arg, override in zip(args, overrides)}
    experiment = str(given["experiment"][1].value()) if "experiment" in given else None
    found = []
    if "bug" in given and given["bug"][1].is_sweep_override() and experiment != "bugs":
        found.append(
            (
                "bug",
                f"{given['bug'][0]} sweeps known bugs only with experiment=bugs: python -m runner -m experiment=bugs "
                f"{given['bug'][0]} (python -m runner -m bug=NAME runs one bug's buggy, fixed and reference arms)",
            )
        )
    if "bug_arm" in given and "bug" not in given and experiment != "bugs":
        found.append(
            (
                "bug_arm",
                f"{given['bug_arm'][0]} picks an arm of a known bug: give the bug too, e.g. bug=double_ga_scaling "
                f"{given['bug_arm'][0]} (conf/bug/ lists them; python -m runner --help names them)",
            )
        )
    return found
