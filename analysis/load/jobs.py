"""Where the jobs are: the newest result, a path's job directories, the distinct jobs of several paths (each
once, a sweep's earlier invocations left out: `analysis.load.invocations`), and the folders a job started but
left without a record. No job's files are read here beyond whether they exist and when Hydra launched them."""

from __future__ import annotations

from pathlib import Path

from analysis.load.invocations import earlier_invocation_note, earlier_invocations


def newest_result(roots: tuple[Path, ...] = (Path("multirun"), Path("outputs"))) -> Path:
    """The newest sweep (multirun/<date_time>) or single run (outputs/<date_time>), by modification time."""
    found = [
        path
        for root in roots
        if root.is_dir()
        for path in root.iterdir()
        if (path / "multirun.yaml").exists() or (path / "config.yaml").exists()
    ]
    if not found:
        where = " or ".join(f"{root}/" for root in roots)
        raise FileNotFoundError(f"no sweep or run under {where} (run `make run` first, or pass a directory)")
    return max(found, key=lambda path: path.stat().st_mtime)


def job_dirs(path: Path) -> list[tuple[Path, Path]]:
    """(the folder that names it, the job directory) of every job at `path`: a job directory itself
    (it holds config.yaml), or a sweep's or run's folder with job directories in it. Hidden folders
    (Hydra's .hydra/ holds a config.yaml too) are not jobs."""
    if (path / "config.yaml").exists():
        return [(path.parent, path)]
    if not path.is_dir():
        return []
    children = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    return [(path, child) for child in children if (child / "config.yaml").exists()]


def not_a_result(path: Path) -> str | None:
    """Why `path` cannot be analysed, or None."""
    expected = "give a sweep directory (multirun/<date_time>), a run's (outputs/<date_time>) or a job's"
    if not path.exists():
        return f"{path} does not exist; {expected}"
    if not path.is_dir():
        return f"{path} is a file; {expected}"
    return None


def distinct_jobs(sweeps: list[Path]) -> tuple[list[tuple[Path, Path]], list[str]]:
    """The jobs at `sweeps`, each once (a folder given twice, `s1 s1/`, or a job given beside its sweep), and a
    note for each one given again; a sweep's jobs of an earlier invocation into its folder are left out, with a
    note (`analysis.load.invocations`)."""
    jobs, seen, notes = [], {}, []
    for sweep in sweeps:
        found = job_dirs(sweep)
        earlier = set(earlier_invocations(sweep, [job for named, job in found if named == sweep]))
        if earlier:
            notes.append(earlier_invocation_note(sweep, sorted(earlier)))
        for named, job in found:
            if job in earlier:
                continue
            key = job.resolve()
            if key in seen:
                notes.append(f"{job} was given twice (also as {seen[key]}): analysed once")
                continue
            seen[key] = job
            jobs.append((named, job))
    if len(notes) > 3:
        notes = [*notes[:2], f"... and {len(notes) - 2} more jobs given twice: each analysed once"]
    return jobs, notes


def recordless(sweeps: list[Path]) -> list[str]:
    """Folders in a sweep that a job started (Hydra's .hydra/ is there) but that hold no config.yaml: a job,
    such as `make run`'s cost job, that stopped before it recorded anything."""
    notes = []
    for sweep in sweeps:
        if not sweep.is_dir() or (sweep / "config.yaml").exists():
            continue
        for child in sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if (child / ".hydra").is_dir() and not (child / "config.yaml").exists():
                what = "the cost job" if child.name == "cost" else "a job"
                notes.append(f"{what} in {child} left no record (no config.yaml): it stopped before it was admitted")
    return notes
