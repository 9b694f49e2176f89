"""A job directory that already holds an earlier attempt: keep it, retry it, or move it aside; never overwrite
a finished job silently.

- the same config, completed: the job is skipped (the sweep's tally counts it as skipped);
- the same config, not completed: its files are cleared and it runs again;
- another config that ran (a changed `data.path`, say, in a rerun into the same sweep directory): the
  earlier attempt's files move to `superseded/<job>-<time>/` beside the job directory, whatever its status,
  and the log names the keys that differ. The analysis reads job directories only, so it sees the new run
  alone. Another config that never ran (refused, or skipped) is cleared.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from runner.record.config_file import parse_config
from runner.record.summary import read_summary

# What a job writes into its directory (Hydra's own .hydra/ and runner.log belong to the new job).
JOB_FILES = (
    "config.yaml",
    "config.json",
    "summary.json",
    "metrics.jsonl",
    "metrics.arrow",
    "floor.json",
    "logs",
    "wandb",
)
SUPERSEDED = "superseded"


def earlier_attempt(job_dir: Path, config_yaml: str) -> str:
    """What the directory holds: "none"; "completed" or "unfinished" (the same config); "different" (another
    config that ran: its results are kept); "stale" (another config that never ran: invalid or skipped)."""
    config_file = job_dir / "config.yaml"
    if not config_file.exists():
        return "none"
    status = (read_summary(job_dir) or {}).get("status")
    if config_file.read_text() != config_yaml:
        ran = status in ("completed", "failed", "diverged") or (job_dir / "metrics.jsonl").exists()
        return "different" if ran else "stale"
    return "completed" if status == "completed" else "unfinished"


def differing_keys(old_yaml: str, new_yaml: str) -> list[str]:
    """The dotted keys whose values differ between two config.yaml texts, with both values."""
    old, new = _flat(parse_config(old_yaml) or {}), _flat(parse_config(new_yaml) or {})
    return [
        f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
    ]


def _flat(config: object, prefix: str = "") -> dict:
    if not isinstance(config, dict):
        return {prefix.rstrip("."): config}
    flat = {}
    for key, value in config.items():
        flat.update(_flat(value, f"{prefix}{key}."))
    return flat


def supersede(job_dir: Path) -> Path:
    """Move the earlier attempt's files to superseded/<job>-<time>/ beside the job directory; returns that folder."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = job_dir.parent / SUPERSEDED / f"{job_dir.name}-{stamp}"
    suffix = 1
    while target.exists():
        target = target.with_name(f"{job_dir.name}-{stamp}-{suffix}")
        suffix += 1
    target.mkdir(parents=True)
    for name in JOB_FILES:
        if (job_dir / name).exists():
            shutil.move(str(job_dir / name), str(target / name))
    return target


def clear(job_dir: Path) -> None:
    """An unfinished attempt of the same config starts again clean."""
    for name in JOB_FILES:
        if name == "config.yaml":
            continue
        path = job_dir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
