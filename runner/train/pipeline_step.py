"""One optimizer step's gradients through a pipeline (`pp` > 1): the schedule's steps, the loss gathered from
the last stage, and the grad norm over every stage.

Notation as in `runner.train.reduction` and `runner.model.pipeline_parallel`. Every stage counts N over its
data ranks (the same N on each: the stages of a pipeline hold the same rows), and each gradient-accumulation
micro-batch m is one `schedule.step`, which splits it into K pipeline micro-batches and calls the mode's
loss on each k's logits on the last stage:

    loss_k = the mode's loss of (S_rmk, n_rm)        e.g. S_rmk / N (local), AR(S_rmk / N) (sum)

so sum_k loss_k is the loss of micro-batch m without pipelining. The modes' collectives run over the last
stage's data ranks, which alone have a loss; L and what the mode reports then reach the other stages with
one all-reduce over the pipeline (`pp_all_reduce`: the earlier stages add zeros), for rank 0 to log, as a
trainer logs the last stage's loss.

The grad norm: each stage's norm over its own parameters (DTensor's, over the data ranks), combined over the
stages as torchtitan's `clip_grad_norm_` does with a pp mesh (pytorch/torchtitan,
torchtitan/distributed/utils.py lines 459-465 at 018740b7aae7846d24954539244c78215dbd181f): ||g|| =
sqrt(sum_stages ||g_stage||^2), one all-reduce of the squares over the pipeline (here in float64).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from runner.config import RunConfig
from runner.data.batches import Batch
from runner.model.parallel import Meshes, mixed_precision_policy
from runner.model.pipeline_parallel import StageShapes, pipeline_schedule
from runner.train.reduction import LossReducer, StepLoss, global_valid_tokens


class PipelineStep:
    """This rank's stage in its pipeline: `forward_backward` per optimizer step, `grad_norm` for clipping."""

    def __init__(self, stage_module: nn.Module, meshes: Meshes, cfg: RunConfig, device: torch.device):
        assert meshes.pp is not None, "a pipeline needs its pp mesh"
        self.group = meshes.pp.get_group()
        stage, stages = meshes.pp.get_local_rank(), meshes.pp.size()
        self.first, self.last = stage == 0, stage == stages - 1
        self.stage_module = stage_module
        self.device = device
        self.reducer: LossReducer | None = None
        self.micro: Batch | None = None  # the gradient-accumulation micro-batch in the schedule now
        microbatches = cfg.pp_microbatches or stages
        dp = dist.get_world_size(meshes.loss_group)  # sp = 1 under pp: the data ranks are the dp ranks
        rows = cfg.train.global_batch // (dp * cfg.grad_accum) // microbatches  # one pipeline micro-batch's
        activations = mixed_precision_policy(cfg.mp).param_dtype or torch.float32
        self.schedule = pipeline_schedule(
            stage_module,
            meshes.pp,
            device,
            StageShapes(rows, cfg.train.seq_len, cfg.model.d_model, cfg.model.vocab_size, activations),
            cfg.pp_schedule,
            microbatches,
            self._loss,
            cfg.pp_scale_grads,
        )

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The mode's loss of one pipeline micro-batch k (its rows of micro-batch m), on the last stage."""
        return self.reducer.micro_batch_loss(logits, labels, self.micro)

    def forward_backward(self, micro_batches: list[Batch], reducer: LossReducer) -> StepLoss:
        """One optimizer step's gradients on this stage, accumulated over this rank's micro-batches."""
        self.reducer = reducer
        reducer.start_step(global_valid_tokens(micro_batches, reducer.group, self.device))
        reducer.plan_step(micro_batches)
        for micro in micro_batches:
            self.micro = micro
            inputs = (micro.inputs.to(self.device),) if self.first else ()
            target = micro.labels.to(self.device) if self.last else None
            self.schedule.step(*inputs, target=target, return_outputs=False)
        reducer.finish_gradients(self.stage_module)
        step = reducer.finish_step()
        values = torch.tensor([step.loss, step.reported] if self.last else [0.0, 0.0], dtype=torch.float64)
        dist.all_reduce(values, group=self.group)  # the last stage's values, on every stage
        loss, reported = values.tolist()
        return StepLoss(loss=loss, reported=reported, valid_tokens=step.valid_tokens)

    def last_stage_counts(self, counts: dict) -> dict:
        """The last stage's {calls, bytes, seconds} of a collective kind, on every stage (one all-reduce over
        the pipeline, outside the counted phases): the loss's all-reduces run there, and rank 0 logs them."""
        keys = ("calls", "bytes", "seconds")
        own = [float(counts.get(key, 0)) for key in keys] if self.last else [0.0, 0.0, 0.0]
        values = torch.tensor(own, dtype=torch.float64)
        dist.all_reduce(values, group=self.group)
        calls, size, seconds = values.tolist()
        return {"calls": int(calls), "bytes": int(size), "seconds": seconds}

    def grad_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The whole model's L2 norm from this stage's gradients: sqrt of the stages' squared norms summed."""
        own = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        own = own.full_tensor() if hasattr(own, "full_tensor") else own
        squares = own.double().pow(2)
        dist.all_reduce(squares, group=self.group)
        return squares.sqrt().to(own.dtype)
