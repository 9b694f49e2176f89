"""A job directory that already holds an earlier attempt: keep it, retry it, or move it aside; never overwrite
or mix in a finished job silently.

The attempt is judged by its run identity (`runner.sweep.identity`, summary.json's `identity`: the resolved
config, the data's, tokenizer's, model config's and callable's content, the packages' versions):

- the same identity, completed: the job is skipped (the sweep's tally counts it as skipped);
- the same identity, not completed (failed, diverged, interrupted, killed): it resumes from its newest complete
  checkpoint (`train.checkpoint_every`; its checkpoints and records are kept, the rest cleared), or, with none,
  its files are cleared and it runs again from step 1;
- the same identity but for keys that change no step's computation (`CONTINUABLE`: train.steps, the
  printing cadence, the timeouts), completed or not, with a complete checkpoint before the new train.steps:
  it continues from that checkpoint (`python -m runner train.steps=400 ...` after 200, or after a Ctrl-C with
  another train.steps), as an unfinished attempt resumes;
- another identity (a changed `data.path`, the same path with other contents, another torch), or none
  recorded, where the attempt ran: its files move to `superseded/<job>-<time>/` beside the job directory,
  whatever its status, and one log line names what differs. The analysis reads job directories only, so it
  sees the new run alone. An attempt that never ran (refused, skipped, interrupted before its ranks) is cleared.

Only a job that will run moves an earlier attempt: one refused before launch (or skipped on this machine)
leaves the folder's files as they were and records its outcome in refused.json beside them, for the tally
(`record_refusal`).
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

from runner.record import checkpoints
from runner.record.config_file import parse_config
from runner.record.summary import read_summary, update_summary

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
    "checkpoints",
)
# What a resumed attempt keeps (`resumable`): its checkpoints, the records up to the newest (the ranks cut the
# rest), and its W&B run's files.
RESUMED_FILES = ("checkpoints", "metrics.jsonl", "wandb")
REFUSED = "refused.json"  # this invocation's refusal of a job whose folder holds an earlier run (for the tally)
SUPERSEDED = "superseded"


def holds_results(job_dir: Path) -> bool:
    """Whether the folder holds an attempt that ran (its ranks started): its results are never overwritten."""
    status = (read_summary(job_dir) or {}).get("status")
    return status in ("completed", "failed", "diverged") or (job_dir / "metrics.jsonl").exists()


def earlier_attempt(job_dir: Path, identity: dict, config_yaml: str | None = None) -> str:
    """What the directory holds: "none"; "completed" or "unfinished" (an attempt with this identity);
    "continued" (this identity but for `CONTINUABLE` keys of `config_yaml`, with a checkpoint to continue from);
    "different" (another identity, or none recorded, that ran: its results are kept); "stale" (an attempt that
    never ran: refused, skipped, interrupted before its ranks started)."""
    summary = read_summary(job_dir)
    if summary is None and not (job_dir / "config.yaml").exists():
        return "none"
    if not holds_results(job_dir):
        return "stale"
    if (summary or {}).get("identity", {}).get("digest") != identity["digest"]:
        return "continued" if _continues(job_dir, summary or {}, identity, config_yaml) else "different"
    return "completed" if summary.get("status") == "completed" else "unfinished"


# Keys whose change leaves every step's computation as it was (runner.trajectory), and whose records an earlier
# attempt's steps share with a new one: how many steps, how often a step is printed, when a job is killed.
CONTINUABLE = ("train.steps", "train.log_every", "timeout_s", "dist.timeout_s")


def _continues(job_dir: Path, summary: dict, identity: dict, config_yaml: str | None) -> bool:
    """Whether an earlier attempt that differs from `identity` in CONTINUABLE keys alone can be continued: the
    rest of its identity (data, code, versions) the same, and a complete checkpoint before the new train.steps."""
    old = summary.get("identity") or {}
    same_rest = {k: v for k, v in (old.get("parts") or {}).items() if k != "config"} == {
        k: v for k, v in identity["parts"].items() if k != "config"
    } and old.get("versions") == identity["versions"]
    if config_yaml is None or not same_rest or not (job_dir / "config.yaml").exists():
        return False
    old_flat = flat_config(parse_config((job_dir / "config.yaml").read_text()) or {})
    new_flat = flat_config(parse_config(config_yaml) or {})
    changed = {key for key in old_flat.keys() | new_flat.keys() if old_flat.get(key) != new_flat.get(key)}
    if not changed or not changed <= set(CONTINUABLE) or not new_flat.get("train.checkpoint_every"):
        return False
    newest = checkpoints.newest_complete(job_dir)
    return newest is not None and newest[0] < int(new_flat["train.steps"])


def differing_keys(old_yaml: str, new_yaml: str) -> list[str]:
    """The dotted keys whose values differ between two config.yaml texts, with both values."""
    old, new = flat_config(parse_config(old_yaml) or {}), flat_config(parse_config(new_yaml) or {})
    return [
        f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
    ]


def flat_config(config: object, prefix: str = "") -> dict:
    """A parsed config as {dotted key: value}."""
    if not isinstance(config, dict):
        return {prefix.rstrip("."): config}
    flat = {}
    for key, value in config.items():
        flat.update(flat_config(value, f"{prefix}{key}."))
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
    (job_dir / REFUSED).unlink(missing_ok=True)
    return target


def progress(job_dir: Path) -> str:
    """How far an interrupted job got, from its metrics file, and where a rerun starts."""
    metrics = job_dir / "metrics.jsonl"
    steps = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    newest = checkpoints.newest_complete(job_dir)
    rerun_starts = (
        f"a rerun into this directory resumes from its checkpoint of step {newest[0]}"
        if newest is not None
        else "a rerun into this directory runs it again"
    )
    if not steps:
        return f"before its first step was recorded; {rerun_starts}"
    return f"after {steps} recorded step(s), which are kept; {rerun_starts}"


def resume_reason(job_dir: Path, earlier: str, config_yaml: str) -> str:
    """Why a job resumes, for its log line: an unfinished attempt, or one of other CONTINUABLE keys (named)."""
    what = "an unfinished attempt"
    if earlier == "continued":
        what = "an attempt of other " + "; ".join(differing_keys((job_dir / "config.yaml").read_text(), config_yaml))
    return f"{what}; its ranks pass over a checkpoint whose files are damaged"


def resumable(job_dir: Path, checkpoint_every: int) -> int | None:
    """The step an unfinished attempt of this identity resumes from (its newest complete checkpoint), or None:
    it runs again from step 1 (no checkpoints, or `train.checkpoint_every=0` now)."""
    newest = checkpoints.newest_complete(job_dir) if checkpoint_every else None
    return None if newest is None else newest[0]


def clear(job_dir: Path, *, keep: tuple[str, ...] = ()) -> None:
    """An attempt that did not complete, or never ran, makes way for this one: its files are removed, but for
    `keep` (a resumed attempt's, `RESUMED_FILES`)."""
    for name in (*JOB_FILES, REFUSED):
        if name in keep:
            continue
        path = job_dir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def record_refusal(job_dir: Path, outcome: str, **fields) -> None:
    """refused.json: a job refused (or skipped) in this invocation, beside an earlier run's files left as they were."""
    record = {"outcome": outcome, "outcome_at": round(time.time(), 3), **fields}
    tmp = job_dir / f"{REFUSED}.tmp"
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    tmp.replace(job_dir / REFUSED)


def recorded_since(job_dir: Path, since: float) -> bool:
    """Whether the job recorded its outcome in the invocation that started at `since`."""
    outcomes = (
        (read_summary(job_dir) or {}).get("outcome_at", 0),
        (read_summary(job_dir, REFUSED) or {}).get("outcome_at", 0),
    )
    return max(outcomes) >= since


def record_interrupted(job_dir: Path, signum: int, since: float, *, ours: bool = False) -> None:
    """summary.json of a job of this invocation (started at `since`; `ours`: the caller is that job) that a
    signal stopped before it recorded anything, unless its folder holds an earlier run's results: those are
    left as they were."""
    if not job_dir.is_dir() or not (ours or started_since(job_dir, since)) or recorded_since(job_dir, since):
        return
    if holds_results(job_dir):
        return
    clear(job_dir)
    update_summary(
        job_dir,
        status="failed",
        interrupted=True,
        error=f"interrupted ({signal.Signals(signum).name}) before its ranks started; a rerun into this directory runs it",
        outcome="failed",
        outcome_at=round(time.time(), 3),
    )


def started_since(job_dir: Path, since: float) -> bool:
    """Whether Hydra made or started this job folder in the invocation that started at `since`: the folder, or
    what Hydra writes into it before it calls the job (.hydra/), changed since."""
    marks = [job_dir, job_dir / ".hydra", job_dir / ".hydra" / "overrides.yaml"]
    return any(mark.exists() and mark.stat().st_mtime >= since for mark in marks)


def jobs_started_since(sweep_dir: Path, since: float) -> list[Path]:
    """The job folders of `sweep_dir` that Hydra made or started in the invocation that started at `since`."""
    if not sweep_dir.is_dir():
        return []
    folders = (p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != SUPERSEDED)
    return [job for job in sorted(folders) if not job.name.startswith("analysis") and started_since(job, since)]
