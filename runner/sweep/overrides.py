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
    return found


def fixed_overrides(args: list[str]) -> list[str]:
    """The overrides of `args` that set one value, as given: what a sweep's own interleaved cost job
    shares with it (`make run ARGS=...`). Left out: a sweep's lists, `experiment=` (the cost job's is
    `cost`) and Hydra's own keys (where the sweep goes)."""
    candidates = [arg for arg in args if "=" in arg and not arg.startswith("-")]
    overrides = OverridesParser.create().parse_overrides(candidates)
    return [
        arg
        for arg, override in zip(candidates, overrides)
        if not (override.is_sweep_override() or override.is_hydra_override() or override.key_or_group == "experiment")
    ]


def cost_job_overrides(args: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Of a sweep's fixed overrides (`fixed_overrides`), those its interleaved cost job (`experiment=cost`)
    accepts, in order, and those it would refuse, each with why (`make run ARGS=...`: `train.steps=5` leaves
    no step after the cost job's warm-up, `trainer=xtuner` is a custom callable the cost job cannot time)."""
    from hydra import compose, initialize_config_dir
    from omegaconf.errors import OmegaConfBaseException

    from runner.config import register_configs
    from runner.sweep.admission import Refused, admit
    from runner.sweep.machine import usable_cpu_cores, visible_cuda_devices

    register_configs()
    machine = {"cuda_devices": visible_cuda_devices(), "cpu_cores": usable_cpu_cores()}

    def problems(overrides: list[str]) -> set[str]:
        try:
            verdict = admit(compose("config", ["experiment=cost", *overrides]), machine=machine)
        except (HydraException, OmegaConfBaseException) as error:
            return {str(error).strip().splitlines()[0]}
        return {message for _, message in verdict.problems} if isinstance(verdict, Refused) else set()

    accepted, left_out = [], []
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        before = problems(accepted)
        for arg in fixed_overrides(args):
            after = problems([*accepted, arg])
            if after - before:
                left_out.append((arg, "; ".join(sorted(after - before))))
            else:
                accepted.append(arg)
                before = after
    return accepted, left_out


if __name__ == "__main__":
    # `python -m runner.sweep.overrides ARGS...` prints the fixed ones the cost job accepts (the Makefile's
    # `make run` passes them to it), and says on stderr which it left out and why.
    import sys

    accepted, left_out = cost_job_overrides(quote_home_paths(sys.argv[1:]))
    for arg, why in left_out:
        print(f"make run: the cost job leaves out {arg} ({why})", file=sys.stderr)
    print(" ".join(accepted))
