"""B11: what a checkpoint costs (`train.checkpoint_every`): save and load time and size, against a step's time.

One W=2 gloo world per model (the default tiny decoder, and `model=hf_llama`). After a few steps (so that
AdamW's moments exist), each round runs, in a random order and each after a barrier: a training step
(`step`), a second training step (`step_again`, the null control: the same work as `step`), a checkpoint's
save (`runner.train.checkpoint.save`, published as a run publishes it) and its load. A time is the slowest
rank's. Ratios against `step` are paired per round, with moving-block bootstrap CIs
(`analysis.cost.bootstrap`). What `checkpoint_every=K` costs a run is save / (K x step): a save every K steps.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

import pandas as pd

ARMS = ("step", "step_again", "save", "load")
MODELS = {"tiny (default)": {}, "hf_llama": {"model": "hf_llama"}}


def rank_times(model: str, rounds: int, folder: str, seed: int) -> dict:
    """On every rank of a W=2 world: {arm: [seconds per round]} (this rank's; the caller takes the slowest)."""
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from runner.config import config_with, rank_config
    from runner.layout import ParallelLayout
    from runner.model.parallel import build_meshes
    from runner.record import checkpoints
    from runner.train import checkpoint
    from runner.train.components import build_parts
    from runner.train.loop import Trainer

    overrides = {"world_size": 2, "grad_accum": 2, "wandb.mode": "disabled", "train.steps": 10_000}
    cfg = config_with(overrides)
    if model:
        cfg.model = OmegaConf.merge(
            cfg.model, OmegaConf.load(Path(__file__).resolve().parents[1] / "conf/model" / f"{model}.yaml")
        )
    cfg = rank_config(cfg)
    layout = ParallelLayout(2, 1, 2)
    parts = build_parts(cfg, build_meshes(layout, "cpu"), __import__("torch").device("cpu"))
    trainer = Trainer(parts)
    job = Path(folder)
    step = 0
    for _ in range(3):  # AdamW's state exists before the first save
        step += 1
        trainer.step(step)
    order = random.Random(seed)
    times = {arm: [] for arm in ARMS}
    sizes = []
    for _ in range(rounds):
        arms = list(ARMS)
        order.shuffle(arms)
        if arms.index("load") < arms.index("save"):  # a load reads this round's save
            arms.remove("load")
            arms.append("load")
        for arm in arms:
            dist.barrier(parts.group)
            start = time.perf_counter()
            if arm in ("step", "step_again"):
                step += 1
                trainer.step(step)
            elif arm == "save":
                checkpoint.save(
                    parts.model, parts.optimizer, step=step, tokens=trainer.tokens, job_dir=job, keep=1,
                    group=parts.group, layout=layout,
                )  # fmt: skip
            else:
                checkpoint.load(
                    parts.model, parts.optimizer, folder=checkpoints.newest_complete(job)[1], group=parts.group,
                    layout=layout,
                )  # fmt: skip
            times[arm].append(time.perf_counter() - start)
        newest = checkpoints.newest_complete(job)[1]
        sizes.append(sum(p.stat().st_size for p in newest.iterdir()))
    trainer.gather_pending()
    return {"times": times, "bytes": sizes[-1]}


def run(quick: bool) -> tuple[str, str, str, str]:
    from analysis.cost.bootstrap import paired_overheads
    from runner.testing.local_world import run_in_world

    rounds = 8 if quick else 60
    rows = []
    for name, preset in MODELS.items():
        with tempfile.TemporaryDirectory() as folder:
            ranks = run_in_world(rank_times, 2, preset.get("model", ""), rounds, folder, 0, timeout_s=3600)
        slowest = pd.DataFrame({arm: [max(r["times"][arm][i] for r in ranks) for i in range(rounds)] for arm in ARMS})
        slowest.index = range(1, rounds + 1)
        table = paired_overheads(slowest, warmup_steps=0, baseline="step")
        for _, row in table.iterrows():
            rows.append(
                {
                    "model": name,
                    "arm": row["mode"],
                    "step_ms": row["local_ms"],
                    "arm_ms": row["local_ms"] + row["extra_ms"],
                    "ratio_to_step": row["ratio"],
                    "ci_low": row["ci_low"],
                    "ci_high": row["ci_high"],
                    "checkpoint_MB": ranks[0]["bytes"] / 2**20,
                }
            )
    frame = pd.DataFrame(rows)
    null = frame[frame["arm"] == "step_again"]
    null_holds = bool(((null["ci_low"] <= 1) & (null["ci_high"] >= 1)).all())
    saves = frame[frame["arm"] == "save"]
    per_k = "; ".join(
        f"{row['model']}: {row['ratio_to_step']:.2f} steps per save, so checkpoint_every=100 adds "
        f"{row['ratio_to_step'] / 100 * 100:.1f} % and 1000 adds {row['ratio_to_step'] / 1000 * 100:.2f} %"
        for _, row in saves.iterrows()
    )
    body = f"""
W=2 gloo ranks, grad_accum=2, AdamW; {rounds} rounds per model, the four arms in a random order each round
(a load after its round's save), each after a barrier, the slowest rank's time. Ratios: median over rounds of
the paired ratio to `step`, 95% moving-block bootstrap CIs. checkpoint_MB: one checkpoint's files (both ranks'
shards, their RNG files, meta.json).

{frame.to_markdown(index=False, floatfmt=".3f")}

Null control (`step_again` against `step`): {"holds (its CIs contain 1)" if null_holds else "FAILS: the figures above are not resolved"}.
**What checkpoint_every costs a run** (save time over step time): {per_k}.
"""
    return "B11", "Checkpoints: save and load time and size, against a step", "python -m bench b11", body
