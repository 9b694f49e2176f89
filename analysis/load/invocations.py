"""Job folders that an earlier invocation of a sweep left in its folder.

Hydra writes a sweep's multirun.yaml when each `python -m runner -m ...` into that folder starts, and each job
it launches writes its .hydra/ before the job runs (a job the runner skips as completed earlier too). A job
whose .hydra/ is older than the sweep's multirun.yaml was not launched by the newest invocation: its folder
is left from an earlier list (`-m reduction=sum,local`, then `-m reduction=sum,detached` into the same
folder). The analysis of the sweep takes the newest invocation's jobs and says which it left out; such a job
is still analysed where it is given on its own (its folder as an argument). A single run inside the folder
(`make run`'s cost job: Hydra's mode RUN) belongs to no sweep invocation and is always kept.
"""

from __future__ import annotations

from pathlib import Path


def launched_at(job: Path) -> int | None:
    """When a sweep last launched `job` (ns: its .hydra/overrides.yaml), None where it left no .hydra/ or was
    launched as a single run."""
    try:
        hydra = (job / ".hydra" / "hydra.yaml").read_text()
        return (job / ".hydra" / "overrides.yaml").stat().st_mtime_ns if "\n  mode: MULTIRUN\n" in hydra else None
    except OSError:
        return None


def earlier_invocations(sweep: Path, jobs: list[Path]) -> list[Path]:
    """The jobs of `jobs` (folders of `sweep`) that an invocation before the newest one into `sweep` launched.
    None where `sweep` is not a multirun folder (no multirun.yaml) or a job has no .hydra/ to date it."""
    try:
        newest = (sweep / "multirun.yaml").stat().st_mtime_ns
    except OSError:
        return []
    return [job for job in jobs if (at := launched_at(job)) is not None and at < newest]


def earlier_invocation_note(sweep: Path, left_out: list[Path]) -> str:
    names = ", ".join(job.name for job in left_out[:3]) + (
        f" and {len(left_out) - 3} more" if len(left_out) > 3 else ""
    )
    return (
        f"{len(left_out)} job folder{'s' if len(left_out) > 1 else ''} in {sweep} ({names}) "
        f"{'were' if len(left_out) > 1 else 'was'} launched by an earlier `python -m runner -m` into that folder, "
        "not by its newest (multirun.yaml): left out, so that the analysis is of one invocation; give a job's "
        "folder itself to analyse it"
    )
