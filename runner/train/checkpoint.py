"""Sharded checkpoints of a training run, and resuming from one (`train.checkpoint_every`).

What a step depends on, and where a checkpoint keeps it:
- the model's and the optimizer's state (AdamW's moments and step counts): FSDP2's distributed state dict
  (`torch.distributed.checkpoint.state_dict.get_state_dict`), saved sharded by
  `torch.distributed.checkpoint` (DCP), each rank writing its own shards, and loaded in place;
- the trainer's token counter: `rank<r>.pt`;
- the step. Everything else a step uses is a function of (seed, step, rank) and the config: the batch
  (`runner.data.batches`), the learning rate (`RankParts.set_lr`), the gradient sketch's projections
  (`runner.train.gradients`), a fault's step, and every random draw (dropout: the generators are seeded
  at each step, `runner.train.rng`), so no generator state needs keeping. So a run resumed from step k computes steps k+1.. bit for bit
  as the uninterrupted run did (`tests/test_resume.py`).

The records of the steps up to k are in metrics.jsonl when the checkpoint is published: the trainer gathers
the pending steps' world figures first (`Trainer.gather_pending`), so rank 0 has written them.

A checkpoint is complete or absent (`runner.record.checkpoints`: written under a partial name, renamed by
rank 0 after a barrier). The identity of the run (`runner.sweep.identity`: config, data, code, versions) is
checked by the launcher before it lets a run resume; a changed layout is another run, started anew.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from runner.layout import ParallelLayout
from runner.record import checkpoints

# The optimizer's state keyed by parameter name, param_groups included: indexed by position, a pipeline's
# stages would each save a param_groups[0] (of their own parameters) under one key, and one would be lost.
# torchtitan passes the same option for the same reason (pytorch/torchtitan, torchtitan/components/
# checkpoint.py lines 140-151 and optimizer.py line 144 at 018740b7aae7846d24954539244c78215dbd181f).
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _rank_file(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.pt"


def save(model, optimizer, *, step: int, tokens: int, job_dir: Path, keep: int, group, layout: ParallelLayout) -> None:
    """Every rank: this step's checkpoint (collective). Rank 0 publishes it once all ranks have written."""
    rank = dist.get_rank(group)
    partial = checkpoints.partial_dir(job_dir, step)
    if rank == 0:
        checkpoints.remove_partial(job_dir)  # an earlier attempt's, cut off
        partial.mkdir(parents=True)
    dist.barrier(group)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=_OPTIONS)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(partial), process_group=group)
    torch.save({"tokens": tokens}, _rank_file(partial, rank))
    dist.barrier(group)  # every rank's shards and rank file are on disk
    if rank == 0:
        checkpoints.publish(job_dir, step, {"world_size": layout.world_size, "layout": str(layout)}, keep)
    dist.barrier(group)  # nobody goes on before the checkpoint is complete (a kill now leaves it complete)


def damage(folder: Path) -> str | None:
    """Why the complete checkpoint `folder` cannot be loaded, read from its files alone (no collective), or None:
    DCP's .metadata unreadable, a shard file it names missing or shorter than the bytes it names there, a rank's
    file missing or unreadable. Every rank reads the same files, so every rank judges it alike."""
    try:
        storage = dcp.FileSystemReader(str(folder)).read_metadata().storage_data
    except Exception as error:  # a truncated or missing .metadata: pickle's, OSError's
        return f"its .metadata does not read ({type(error).__name__}: {error})"
    needed: dict[str, int] = {}
    for info in storage.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size < size:
            return f"{name} holds {path.stat().st_size} bytes, its shards need {size}"
    for rank in range(int(checkpoints.read_meta(folder).get("world_size", 0))):
        try:
            torch.load(_rank_file(folder, rank), weights_only=False)
        except Exception as error:
            return f"{_rank_file(folder, rank).name} does not read ({type(error).__name__})"
    return None


def newest_loadable(job_dir: Path) -> tuple[tuple[int, Path] | None, list[str]]:
    """The newest complete checkpoint whose files are whole (`damage`), and a line for each newer one passed over
    (a truncated or missing file: a disk filled up, a file removed), so that a rerun resumes from the newest it can."""
    passed = []
    for step, folder in reversed(checkpoints.complete(job_dir)):
        why = damage(folder)
        if why is None:
            return (step, folder), passed
        passed.append(f"checkpoint {folder.name} cannot be loaded ({why}): passed over")
    return None, passed


def load(model, optimizer, *, folder: Path, group, layout: ParallelLayout) -> dict:
    """Every rank: the model, optimizer and this rank's token count from `folder` (collective); returns
    {"step", "tokens"}. Refuses a checkpoint of another layout (the launcher never offers one)."""
    meta = checkpoints.read_meta(folder)
    if meta.get("layout") != str(layout):
        raise RuntimeError(
            f"checkpoint {folder} was saved at layout {meta.get('layout')}, this run is {layout}: a checkpoint "
            "resumes the run that saved it (another layout is another run)"
        )
    model_state, optimizer_state = get_state_dict(model, optimizer, options=_OPTIONS)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(folder), process_group=group)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"], options=_OPTIONS
    )
    own = torch.load(_rank_file(folder, dist.get_rank(group)), weights_only=False)
    return {"step": meta["step"], "tokens": own["tokens"]}


def state_sha256(model, optimizer, group) -> str:
    """A digest of the whole training state (every rank's shards of the model and the optimizer, in rank
    order), so that two runs' final states compare bit for bit without writing them out (collective)."""
    import hashlib

    model_state, optimizer_state = get_state_dict(model, optimizer, options=_OPTIONS)
    digest = hashlib.sha256()
    for name, value in sorted(_flat({"model": model_state, "optimizer": optimizer_state}).items()):
        digest.update(name.encode())
        if isinstance(value, torch.Tensor):
            local = value.to_local() if hasattr(value, "to_local") else value
            digest.update(local.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(value).encode())
    shards = [None] * dist.get_world_size(group)
    dist.all_gather_object(shards, digest.hexdigest(), group=group)
    return hashlib.sha256("".join(shards).encode()).hexdigest()


def _flat(state, prefix: str = "") -> dict:
    if isinstance(state, dict):
        flat = {}
        for key, value in state.items():
            flat.update(_flat(value, f"{prefix}{key}."))
        return flat
    if isinstance(state, (list, tuple)):
        return _flat(dict(enumerate(state)), prefix)
    return {prefix.rstrip("."): state}
