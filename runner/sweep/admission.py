"""Whether a job may run: every rule checked, before anything is derived from its config.

A job's config is refused (`Refused`) or admitted (`Admitted`) by one function, `admit`, which the sweep's
preflight (`runner.sweep.preflight`) and the job itself (`runner.sweep.job`) both call on the same overrides:
a job that preflight lists as invalid is refused by the same rules when Hydra starts it, and never runs. Only an
`Admitted` job has a layout, a name or a folder of results built from its config, so no value of a refused
config (an sp of 0, say) is ever divided by, formatted or written anywhere but in its refusal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from runner.config import run_config_from, run_config_yaml
from runner.layout import ParallelLayout
from runner.sweep.ignored import ignored_key_problems, trainer_keys, trainer_problems
from runner.sweep.machine import machine_problems
from runner.sweep.overrides import CONF
from runner.sweep.preset_conflicts import preset_conflicts
from runner.sweep.validate import Problems, config_problems, schema_problems


@dataclass(frozen=True)
class Refused:
    problems: Problems
    config_yaml: str | None  # the composed config's text, None when it does not compose


@dataclass(frozen=True)
class Admitted:
    cfg: DictConfig  # the resolved, typed config that passed every rule
    config_yaml: str
    layout: ParallelLayout
    # Keys this job does not read but a sweep sets on purpose (`runner.sweep.ignored`): recorded, not refused.
    ignored: Problems = field(default_factory=list)


def admit(
    task_cfg: DictConfig,
    *,
    machine: dict | None,
    sweeping: bool = False,
    trainer: str | None = None,
    choices: dict | None = None,
    task_overrides: list[str] | None = None,
) -> Admitted | Refused:
    """Every rule for Hydra's composed job config (`task_cfg`): the schema's, the config's own
    (`runner.sweep.validate`), no key it would not read (`runner.sweep.ignored`; `trainer` is Hydra's choice
    of the trainer group), no preset's key given otherwise (`runner.sweep.preset_conflicts`: `choices` are
    Hydra's runtime choices, `task_overrides` the job's overrides) and, with `machine` (`cuda_devices`,
    `cpu_cores`), this machine's."""
    try:
        cfg = run_config_from(task_cfg)
    except OmegaConfBaseException as error:  # a key added with `+` that the schema does not know
        return Refused(schema_problems(error), None)
    config_yaml = run_config_yaml(cfg)
    overridden = trainer_problems(task_cfg, trainer, conf=CONF, sweeping=sweeping)  # as composed: unresolved
    explained = tuple(trainer_keys(trainer, CONF)) if overridden else ()  # the trainer's message says why
    problems = config_problems(cfg, sweeping=sweeping, explained=explained) + overridden
    problems += preset_conflicts(
        cfg, choices, task_overrides, conf=CONF, besides=("trainer",) if overridden else ()
    )  # fmt: skip
    ignored = ignored_key_problems(cfg, sweeping=sweeping, besides=explained)[1]
    if machine is not None and not problems:
        problems = machine_problems(cfg, **machine)
    if problems:
        return Refused(problems, config_yaml)
    return Admitted(cfg, config_yaml, ParallelLayout.from_config(cfg), ignored)


def admit_composed(job: DictConfig, *, machine: dict | None, sweeping: bool) -> Admitted | Refused:
    """`admit` of a job config composed with its Hydra node (`compose(..., return_hydra_config=True)`), which
    gives the trainer choice, the runtime choices and the job's overrides."""
    choices = dict(job.hydra.runtime.choices)
    return admit(
        job,
        machine=machine,
        sweeping=sweeping,
        trainer=choices.get("trainer"),
        choices=choices,
        task_overrides=list(job.hydra.overrides.task),
    )
