"""A job's checkpoints on disk, read without torch: where they live, which is complete, which to keep.

`train.checkpoint_every=K` makes the ranks save a sharded checkpoint every K steps
(`runner.train.checkpoint`) into `<job>/checkpoints/`:

    checkpoints/step-00000010/       a complete checkpoint: the step it follows
        .metadata, __0_0.distcp ...  the model's and optimizer's shards (torch.distributed.checkpoint)
        rank0.pt, rank1.pt ...       each rank's RNG states and counters
        meta.json                    written last, by rank 0, once every rank's files are written
    checkpoints/.partial-step-00000012/   one being written (or cut off): never loaded
    checkpoints/wandb_run_id         the W&B run the checkpoints continue (`runner.record.wandb_run`)

A checkpoint is written under a `.partial-` name and renamed to `step-N` only when every rank's files and
`meta.json` are in it, so a job killed mid-write leaves a partial folder that nothing reads (the next save
or resume removes it). The launcher asks `newest_complete` whether an unfinished attempt can resume.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FOLDER = "checkpoints"
PREFIX = "step-"
PARTIAL = ".partial-"
META = "meta.json"


def name_of(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def checkpoints_dir(job_dir: Path) -> Path:
    return job_dir / FOLDER


def complete(job_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint, oldest first: a `step-N` folder holding its meta.json."""
    folder = checkpoints_dir(job_dir)
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        if not path.name.startswith(PREFIX) or not (path / META).is_file():
            continue
        try:
            step = json.loads((path / META).read_text())["step"]
        except (ValueError, KeyError, TypeError):
            continue  # a meta.json that does not parse is not a complete checkpoint's
        if name_of(step) == path.name:
            found.append((step, path))
    return sorted(found)


def newest_complete(job_dir: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint (step, folder), or None."""
    found = complete(job_dir)
    return found[-1] if found else None


def read_meta(path: Path) -> dict:
    return json.loads((path / META).read_text())


def partial_dir(job_dir: Path, step: int) -> Path:
    return checkpoints_dir(job_dir) / f"{PARTIAL}{name_of(step)}"


def remove_partial(job_dir: Path) -> None:
    """Every checkpoint cut off mid-write."""
    folder = checkpoints_dir(job_dir)
    if folder.is_dir():
        for path in folder.iterdir():
            if path.name.startswith(PARTIAL):
                shutil.rmtree(path, ignore_errors=True)


def publish(job_dir: Path, step: int, meta: dict, keep: int) -> Path:
    """Rank 0, once every rank has written its files: meta.json into the partial folder, the folder renamed to
    `step-N` (one rename: complete or absent), then all but the newest `keep` complete checkpoints removed."""
    partial = partial_dir(job_dir, step)
    tmp = partial / f"{META}.tmp"
    tmp.write_text(json.dumps({"step": step, **meta}, indent=1, sort_keys=True) + "\n")
    tmp.replace(partial / META)
    final = checkpoints_dir(job_dir) / name_of(step)
    if final.exists():  # a resumed run saving the same step again
        shutil.rmtree(final)
    partial.replace(final)
    for _, old in complete(job_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def truncate_metrics(path: Path, last_step: int) -> int:
    """metrics.jsonl cut to the records of steps 1..last_step (a resumed run writes the later ones again);
    returns how many records it keeps. A line cut off mid-write by a kill is dropped with the rest."""
    if not path.exists():
        return 0
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            break
        if record.get("step", last_step + 1) > last_step:
            break
        kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)
    return len(kept)
