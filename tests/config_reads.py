"""Which config keys a rank really reads: the rank's whole job (`runner.world.worker.run_rank`) on a traced config.

The typed config (`runner.config.RunConfig`, nested dataclasses) is copied into subclasses that note every
field read, by its dotted key; the rank then runs as the runner runs it, in a real gloo world (its process
group already joined, so `init_world` and `leave_world` are the world's own). What W&B is given as the run's
config (every key, a record) is not a read.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from pathlib import Path

_paused = [False]
_subclasses: dict[type, type] = {}


def _noting_getattribute(self, name):
    prefix, reads, fields = object.__getattribute__(self, "_trace")
    value = object.__getattribute__(self, name)
    if name in fields and not _paused[0] and not dataclasses.is_dataclass(value):
        reads.add(prefix + name)
    return value


def traced(obj, reads: set[str], prefix: str = ""):
    """A copy of the dataclass `obj` (and its nested ones) that adds the dotted key of every field read to `reads`."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return obj
    cls = type(obj)
    if cls not in _subclasses:
        _subclasses[cls] = type(f"Traced{cls.__name__}", (cls,), {"__getattribute__": _noting_getattribute})
    copy = object.__new__(_subclasses[cls])
    fields = {field.name for field in dataclasses.fields(cls)}
    object.__setattr__(copy, "_trace", (prefix, reads, fields))
    for name in fields:
        object.__setattr__(copy, name, traced(object.__getattribute__(obj, name), reads, f"{prefix}{name}."))
    return copy


@contextmanager
def unnoted():
    _paused[0] = True
    try:
        yield
    finally:
        _paused[0] = False


def rank_reads(cases: list[tuple[str, object]], folder: str) -> dict[str, set[str]]:
    """On every rank of a world: each case's config through `run_rank`; the keys it read, per case."""
    import torch

    import runner.record.wandb_run as wandb_run
    import runner.world.env as env_module
    from runner.config import rank_config
    from runner.world.env import rank_env
    from runner.world.worker import JobInfo, run_rank

    env_module.init_world = lambda env, device_type, timeout_s: torch.device("cpu")  # the world is joined
    env_module.leave_world = lambda: None
    config_container = wandb_run.config_container

    def unnoted_container(cfg):
        with unnoted():
            return config_container(cfg)

    wandb_run.config_container = unnoted_container
    env = rank_env()
    found = {}
    for case, composed in cases:
        reads: set[str] = set()
        job_dir = Path(folder) / case
        job_dir.mkdir(parents=True, exist_ok=True)
        code = run_rank(traced(rank_config(composed), reads), job_dir, env, JobInfo(case, "reads"), 0.0)
        assert code == 0, (case, (job_dir / "summary.json").read_text() if (job_dir / "summary.json").exists() else "")
        found[case] = reads
    return found
