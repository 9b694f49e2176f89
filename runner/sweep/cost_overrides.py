"""A sweep's interleaved cost job (`make run`): which of the sweep's own overrides it shares.

`python -m runner.sweep.cost_overrides ARGS...` prints the fixed overrides of a sweep that its cost job
(`experiment=cost`) accepts, for the Makefile's `make run`; those the cost job would refuse go to stderr,
each with why. Kept apart from runner.sweep.overrides (the command line's checks before Hydra composes),
which admission itself imports: this module composes and admits, so it sits above both.
"""

from __future__ import annotations

import sys

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from runner.config import register_configs
from runner.sweep.admission import Refused, admit
from runner.sweep.machine import usable_cpu_cores, visible_cuda_devices
from runner.sweep.overrides import CONF, quote_home_paths


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
    accepted, left_out = cost_job_overrides(quote_home_paths(sys.argv[1:]))
    for arg, why in left_out:
        print(f"make run: the cost job leaves out {arg} ({why})", file=sys.stderr)
    print(" ".join(accepted))
