"""The training loop of one rank, readable top to bottom.

Every rank runs this same loop on its share of each step's global batch; rank
0 alone writes metrics (JSONL + W&B) and progress lines.

What a step's timing means (`runner.train.meter`):
- `step_time_s` is the world's step time: the slowest rank's forward/backward
  plus optimizer time. A rank that waits in a collective for a slower peer, or
  for rank 0's logging, has that wait in its own time, so the maximum holds it.
- `peer_skew_s` is the spread of the ranks' wall-clock arrival at the step's
  first collective (the valid-token all-reduce): how long the earliest rank
  waited for the latest there.

Each rank keeps its step times, arrivals and gradient-sketch shares, and one
all-gather every `metrics.gather_every` steps (and after the last) turns them
into those world figures; rank 0 writes the steps' records then. A job that
fails writes its pending records with the world figures null (a rank 0 killed
outright loses them: at most gather_every - 1 steps).
"""

from __future__ import annotations

import math
import signal
from pathlib import Path

import torch

from runner.data.batches import Batch, micro_batch_token_range
from runner.record.metrics import MetricLogger, on_schedule, progress_line
from runner.train import checkpoint, fault
from runner.train.components import RankParts
from runner.train.counter import add_counts
from runner.train.gradients import GradientSketch
from runner.train.meter import StepMeter, world_gather
from runner.train.optim import optimizer_step
from runner.train.outcome import TrainResult, divergence
from runner.train.reduction import StepLoss
from runner.train.rng import seed_step
from runner.train.stop_request import StopRequest

NO_COMM = {"calls": 0, "bytes": 0, "seconds": 0.0}


class Trainer:
    """The training and measurement state of one rank; `step(t)` runs optimizer step t."""

    def __init__(self, parts: RankParts, logger: MetricLogger | None = None):
        self.parts = parts
        self.cfg = parts.cfg
        self.logger = logger
        self.reducer = parts.reducer(self.cfg.reduction)
        metrics = self.cfg.metrics
        self.sketch = (
            GradientSketch(parts.model, metrics.sketch_dim, metrics.sketch_seed) if metrics.sketch_dim else None
        )
        self.meter = StepMeter(parts.device, metrics, self.cfg.train.steps, parts.meshes.group_kinds())
        self.tokens = 0
        self.pending: list[tuple[dict, torch.Tensor]] = []  # records awaiting their world figures, with this rank's row

    def step(self, step: int) -> dict:
        """Optimizer step `step` (1-based) on this rank; returns its metrics record (logged on rank 0)."""
        parts, cfg, meter = self.parts, self.cfg, self.meter
        seed_step(cfg.seed, step, parts.rank)  # dropout's masks: from (seed, step, rank) alone
        batch = parts.batches(step)
        micro_batches = parts.local_share(batch)
        lr = parts.set_lr(step)
        fault.before_step(cfg.fault, parts.rank, step)
        meter.start(step)

        with meter.phase("forward_backward"):
            step_loss = parts.forward_backward(micro_batches, self.reducer)
        fault.after_backward(cfg.fault, parts.rank, step, parts.model)
        sketch = self.sketch.partial_sums() if self.sketch is not None else None  # measurement: not timed, not counted
        with meter.phase("optimizer"):
            grad_norm, clip_coef = optimizer_step(
                parts.model, parts.optimizer, cfg.optim.clip, parts.grad_norm(self.reducer)
            )

        true_norm = self.reducer.check_grad_norm()  # a trainer's own norm held to the world's: not timed, not counted
        record = self._record(step, batch, step_loss, grad_norm, clip_coef, lr)
        if true_norm is not None:
            record["true_grad_norm"] = true_norm
        self._hold(record, sketch)
        return record

    def _record(
        self, step: int, batch: Batch, step_loss: StepLoss, grad_norm: float, clip_coef: float, lr: float
    ) -> dict:
        """The step's metrics record; its world figures (step time, skew, sketch) come with the next gather."""
        layout, meter = self.parts.layout, self.meter
        self.tokens += step_loss.valid_tokens
        fewest, most = micro_batch_token_range(batch, dp=layout.dp, grad_accum=self.cfg.grad_accum)
        # FSDP2 moves parameters and gradients with all-gathers and reduce-scatters (and under HSDP an all-reduce
        # over the replicas, counted as replica_all_reduce), Ulysses moves activations with all-to-alls: every
        # all_reduce of forward/backward is the loss's (N and the mode's own).
        counted = meter.comm if meter.counting else None  # sampled steps only: calls and bytes are the same every step
        loss_comm = counted["forward_backward"].get("all_reduce", NO_COMM) if counted else None
        if counted and self.parts.pipeline is not None:  # the loss's all-reduces run on the last stage
            loss_comm = self.parts.pipeline.last_stage_counts(loss_comm)
        return {
            "step": step,
            "dp": layout.dp,
            "sp": layout.sp,
            "tokens": self.tokens,
            "valid_tokens": step_loss.valid_tokens,
            "micro_batch_tokens_min": fewest,
            "micro_batch_tokens_max": most,
            "loss": step_loss.loss,
            "reported_loss": step_loss.reported,
            "grad_norm": grad_norm,
            "clip_coef": clip_coef,
            "lr": lr,
            "step_time_s": None,  # the world figures: filled in by the next gather
            "rank_step_time_s": meter.elapsed,
            "peer_skew_s": None,
            "tokens_per_s": None,
            "comm": add_counts(*counted.values()) if counted else None,
            "loss_comm": loss_comm,
            "grad_sketch": None,
        }

    def _hold(self, record: dict, sketch: torch.Tensor | None) -> None:
        """Keep the record and this rank's row until the gather that gives its world figures."""
        own = self.meter.own_row()
        self.pending.append((record, own if sketch is None else torch.cat([own, sketch])))
        if self.logger is not None:
            self.logger.hold(record)
        if record["step"] % self.cfg.metrics.gather_every == 0 or record["step"] == self.cfg.train.steps:
            self.gather_pending()

    def gather_pending(self) -> None:
        """The world figures of the steps since the last gather (one all-gather; every rank calls it at the same step)."""
        if not self.pending:
            return
        rows = torch.stack([row for _, row in self.pending])
        world = world_gather(rows, self.parts.group, self.parts.device).tolist()
        for (record, _), (step_time, skew, *sketch) in zip(self.pending, world):
            record.update(step_time_s=step_time, peer_skew_s=skew, tokens_per_s=record["valid_tokens"] / step_time)
            record["grad_sketch"] = sketch if self.sketch is not None else None
        self.pending = []
        if self.logger is not None:
            train = self.cfg.train
            for record in self.logger.write_held():
                if on_schedule(record["step"], train.log_every, last=train.steps):
                    print(progress_line(record, train.steps), flush=True)


def train(parts: RankParts, logger: MetricLogger | None, job_dir: Path | None = None) -> TrainResult:
    """Steps 1..train.steps, or from the step after `job_dir`'s newest complete checkpoint (a resumed run:
    `result.resumed_from_step`); with train.checkpoint_every=K, a checkpoint after every K-th step."""
    trainer = Trainer(parts, logger)
    result = TrainResult(status="completed", steps_done=0, final_loss=None)
    train_cfg = parts.cfg.train
    first = 1
    newest = checkpoint.newest_loadable(job_dir)[0] if job_dir is not None and train_cfg.checkpoint_every else None
    if newest is not None:
        resumed = checkpoint.load(
            parts.model, parts.optimizer, folder=newest[1], group=parts.group, layout=parts.layout
        )
        trainer.tokens, first = resumed["tokens"], resumed["step"] + 1
        result.resumed_from_step = result.steps_done = resumed["step"]
        if logger is not None:
            print(f"resumed from the checkpoint of step {resumed['step']}", flush=True)
    asked = StopRequest() if train_cfg.checkpoint_every and job_dir is not None else None
    try:
        _steps(trainer, result, first, job_dir, asked)
    finally:
        if asked is not None:
            asked.restore()
    trainer.gather_pending()  # a diverged or stopped step's world figures (every rank stops at the same step)
    if asked is not None and result.status == "completed":  # a resumed run's end state against an uninterrupted one's
        result.final_state_sha256 = checkpoint.state_sha256(parts.model, parts.optimizer, parts.group)
    if asked is not None and result.stopped_by:
        asked.hand_on()  # submitit's handler, where there was one: it requeues the job
    return result


def _steps(trainer: Trainer, result: TrainResult, first: int, job_dir: Path | None, asked: StopRequest | None) -> None:
    """Steps first..train.steps; a checkpoint after every checkpoint_every-th (but the last) and, when a stop
    was asked (`runner.train.stop_request`), after the step the ranks agree on, which is then the last."""
    parts, logger, train_cfg = trainer.parts, trainer.logger, trainer.cfg.train
    for step in range(first, train_cfg.steps + 1):
        record = trainer.step(step)
        result.steps_done, result.final_loss = step, record["loss"]
        if not math.isfinite(record["reported_loss"]):
            if not result.reported_not_finite and logger is not None:
                print(
                    f"reported loss not finite at step {step}: {record['reported_loss']} (training goes on)", flush=True
                )
            result.reported_not_finite.append(step)
        stop = divergence(step, record["loss"], record["grad_norm"])
        if stop is not None:
            result.status, result.error = "diverged", stop
            if logger is not None:
                print(f"diverged: {stop}", flush=True)
            break
        if step == train_cfg.steps or asked is None:  # the last step ends the run; no checkpoints kept
            continue
        signum = asked.agreed(parts.group, parts.device)
        if step % train_cfg.checkpoint_every == 0 or signum:
            trainer.gather_pending()  # the steps up to this one are in metrics.jsonl before the checkpoint exists
            checkpoint.save(
                parts.model,
                parts.optimizer,
                step=step,
                tokens=trainer.tokens,
                job_dir=job_dir,
                keep=train_cfg.keep_checkpoints,
                group=parts.group,
                layout=parts.layout,
            )
        if signum:
            name = signal.Signals(signum).name
            result.status, result.stopped_by = "failed", name
            result.error = f"stopped by {name} after step {step}, whose checkpoint is saved: a rerun resumes from it"
            if logger is not None:
                print(result.error, flush=True)
            return
