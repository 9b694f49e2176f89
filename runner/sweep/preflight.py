"""Check every job of a sweep before the first one starts.

Hydra's basic sweeper already refuses a sweep in which some job's config
cannot be composed (unknown key, wrong type, bad enum value). This callback
adds the rules every job is admitted by (`runner.sweep.admission`: cross-field, data, and this machine's):
it lists the jobs that break them (each is then recorded as `invalid` without
starting a process) and stops the sweep when no job is valid. On SLURM (`hydra/launcher=slurm` or
`submitit_slurm`) it also refuses, before anything is submitted, a sweep whose
jobs' world_size differs from the tasks the launcher gives each job.
"""

from __future__ import annotations

import logging

from hydra import compose
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from runner.sweep.admission import Admitted, Refused, admit_composed
from runner.sweep.custom_check import check_all
from runner.sweep.ignored import swept_notes
from runner.sweep.machine import usable_cpu_cores, visible_cuda_devices
from runner.sweep.validate import schema_problems

log = logging.getLogger("runner")


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """The override list of every job, as the basic sweeper expands them (its params, then the command line)."""
    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
    overrides = OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))
    return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


def is_slurm(launcher: DictConfig) -> bool:
    return str(launcher.get("_target_", "")).endswith("SlurmLauncher")


def slurm_shape_problems(launcher: DictConfig, world_sizes: list[int]) -> list[str]:
    """Jobs whose world_size is not the SLURM tasks per job (nodes x tasks_per_node), when that is > 1.

    One task per job is fine: the runner then spawns the ranks on its node.
    """
    if not is_slurm(launcher):
        return []
    nodes, per_node = int(launcher.nodes), int(launcher.tasks_per_node)
    tasks = nodes * per_node
    if tasks == 1:
        return []
    return [
        f"  #{number} world_size={world_size} but hydra.launcher gives each job nodes x tasks_per_node = "
        f"{nodes} x {per_node} = {tasks} tasks (one per rank); the shape is set once per sweep, so give "
        f"world_size={world_size} on the command line of its own sweep, or set hydra.launcher.nodes/tasks_per_node"
        for number, world_size in enumerate(world_sizes)
        if world_size != tasks
    ]


class SweepPreflight(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        jobs = sweep_jobs(config)
        composed = [_compose(config.hydra.job.config_name, overrides) for overrides in jobs]
        trainers = [None if isinstance(job, Refused) else job.hydra.runtime.choices.get("trainer") for job in composed]
        world_sizes = [job.get("world_size") for job in composed if not isinstance(job, Refused)]
        shape = slurm_shape_problems(config.hydra.launcher, [w for w in world_sizes if isinstance(w, int)])
        if shape:
            log.error(
                "preflight: the SLURM launcher's shape does not fit these jobs, nothing was submitted:\n"
                + "\n".join(shape)
            )
            raise SystemExit(2)
        # Jobs sent to SLURM check their machine rules on their node, before their ranks start.
        here = (
            None
            if is_slurm(config.hydra.launcher)
            else {"cuda_devices": visible_cuda_devices(), "cpu_cores": usable_cpu_cores()}
        )
        # Every distinct custom.fn in one subprocess (`check_all`): the imports its rules share are paid once.
        check_all(
            [
                str(job.custom.fn)
                for job in composed
                if not isinstance(job, Refused) and job.get("reduction") == "custom" and job.custom.get("fn")
            ]
        )
        # The jobs' own rules (`admit`): a job listed here as invalid is refused by the same call when it starts.
        verdicts = [
            job if isinstance(job, Refused) else admit_composed(job, machine=here, sweeping=True) for job in composed
        ]
        admitted = [(n, v.cfg, v.ignored) for n, v in enumerate(verdicts) if isinstance(v, Admitted)]
        notes, unread = swept_notes(admitted)
        if unread:
            log.error("preflight: " + "; ".join(message for _, message in unread) + "; nothing was started")
            raise SystemExit(2)
        for note in notes:
            log.warning(f"preflight: {note}")
        overridden = sorted(
            {t for t, v in zip(trainers, verdicts) if isinstance(v, Refused) and t and "trainer" in dict(v.problems)}
        )
        to_trainers = (
            f"\nto run these trainers' rules: python -m runner -m experiment=trainers trainer={','.join(overridden)}"
            if overridden
            else ""
        )
        invalid = [
            _line(number, overrides, verdict.problems)
            for number, (overrides, verdict) in enumerate(zip(jobs, verdicts))
            if isinstance(verdict, Refused)
        ]
        if not invalid:
            log.info(f"preflight: all {len(jobs)} jobs are valid")
            return
        report = "\n".join(invalid) + to_trainers
        if len(invalid) == len(jobs):
            log.error(f"preflight: no job of this sweep is valid, nothing was started:\n{report}")
            # Hydra turns a callback's exceptions into warnings; SystemExit is not an Exception.
            raise SystemExit(2)
        log.warning(f"preflight: {len(invalid)} of {len(jobs)} jobs are invalid and will not start:\n{report}")


def _compose(config_name: str, overrides: list[str]) -> DictConfig | Refused:
    try:
        return compose(config_name, overrides, return_hydra_config=True)
    except OmegaConfBaseException as error:  # a key added with `+` that the schema does not know
        return Refused(schema_problems(error), None)


def _line(number: int, overrides: list[str], problems: list[tuple[str, str]]) -> str:
    return f"  #{number} {' '.join(overrides)}: {'; '.join(message for _, message in problems)}"
