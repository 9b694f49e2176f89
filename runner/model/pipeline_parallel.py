"""Pipeline parallelism of the runner's decoder (`pp` > 1): its layers split into P stages, one per rank of a
pipeline, scheduled by torch.distributed.pipelining (`PipelineStage`, `ScheduleGPipe` or `Schedule1F1B`).

Each stage is built as torchtitan builds one (pytorch/torchtitan,
torchtitan/distributed/pipeline_parallel.py `pipeline_module_split`, lines 389-431 at
018740b7aae7846d24954539244c78215dbd181f): the whole model with the other stages' modules removed, the
embedding kept on the first stage and the final norm and head on the last, so every parameter keeps its
name (`blocks.3.ffn.w_up.weight`) whatever stage holds it. The blocks split as evenly as they go, the
first `n_layers % P` stages taking one more (torchtitan's `generate_llm_fqn_per_model_part` also counts the
embedding and the head as a layer each: which rank runs a layer changes no gradient). FSDP shards each
stage over the data ranks of its pipeline coordinate (`Meshes.fsdp`), as torchtitan shards each stage.

Notation as in `runner.train.reduction`, with P = pp and W = dp * sp * tp * P. The P stages of one pipeline
hold the same rows of the batch: a gradient-accumulation micro-batch m of data rank r goes through one
schedule step, split into K pipeline micro-batches k (`pp_microbatches`, rows r_mk). The loss exists on
the last stage only: the schedule calls the mode's loss on each k's logits, S_rmk / N for the token-sum
modes, and backpropagates it through every stage. Since sum_k S_rmk = S_rm, each mode's gradient is the one
it has without pipelining, with W the data ranks W / (tp x P); mean_of_means divides every k by the whole
micro-batch's n_rm (not k's own count), so its weights too are those of the micro-batch without pipelining.

torch's `scale_grads=True` (the schedules' default, `pp_scale_grads`) divides every gradient by K after each
schedule step: right for a loss that is each micro-batch's mean, a factor 1/K for a sum over N, and under
gradient accumulation it divides the gradients accumulated by the earlier steps again, so the step's gradient
is sum_m g_m / K^(M - m + 1): the moving average of torchtitan #1733 (fixed by PR #1732, scale_grads=False).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import PipelineScheduleSingle

from runner.config import PipelineSchedule
from runner.model.decoder import AttentionFn, Decoder, rotary_cos_sin

SCHEDULES = {PipelineSchedule.gpipe: ScheduleGPipe, PipelineSchedule.one_f_one_b: Schedule1F1B}


def stage_layers(n_layers: int, stages: int, stage: int) -> range:
    """The layers of `stage` (0-based) of `stages`: contiguous, the first n_layers % stages stages one longer."""
    base, longer = divmod(n_layers, stages)
    start = stage * base + min(stage, longer)
    return range(start, start + base + (stage < longer))


class DecoderStage(nn.Module):
    """Stage `stage` of a `Decoder` cut into `stages`: its layers (under their names in the whole model), the
    embedding on the first stage, the final norm and the head on the last. The first stage takes tokens
    [batch, seq]; every other stage the previous one's hidden states; the last returns logits."""

    def __init__(self, decoder: Decoder, stage: int, stages: int):
        super().__init__()
        self.cfg = decoder.cfg
        self.embed = decoder.embed if stage == 0 else None
        self.blocks = nn.ModuleDict({str(i): decoder.blocks[i] for i in stage_layers(self.cfg.n_layers, stages, stage)})
        last = stage == stages - 1
        self.norm = decoder.norm if last else None
        self.head = decoder.head if last else None
        self.attention: AttentionFn = decoder.attention

    def layers(self) -> list[nn.Module]:
        """The modules FSDP2 shards one by one (the stage's root is sharded too)."""
        return list(self.blocks.values())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)  # sp = 1: every stage sees the whole sequence
        cos, sin = rotary_cos_sin(positions, self.cfg.d_model // self.cfg.n_heads, self.cfg.rope_theta)
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x, cos, sin, self.attention)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


@dataclass(frozen=True)
class StageShapes:
    """What passes between the stages for one pipeline micro-batch: tokens [rows, seq_len] into the first,
    hidden states [rows, seq_len, d_model] between, logits [rows, seq_len, vocab_size] out of the last (in
    the dtype FSDP computes in)."""

    rows: int
    seq_len: int
    d_model: int
    vocab_size: int
    dtype: torch.dtype

    def of(self, stage: int, stages: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Meta tensors of stage `stage`'s input and output; hidden states coming in take a gradient (which
        the stage sends back)."""
        tokens = torch.empty((self.rows, self.seq_len), dtype=torch.int64, device="meta")
        hidden = torch.empty((self.rows, self.seq_len, self.d_model), dtype=self.dtype, device="meta")
        logits = torch.empty((self.rows, self.seq_len, self.vocab_size), dtype=self.dtype, device="meta")
        example_in = tokens if stage == 0 else hidden.clone().requires_grad_(True)
        return example_in, (logits if stage == stages - 1 else hidden)


def pipeline_schedule(
    stage_module: nn.Module,
    pp: DeviceMesh,
    device: torch.device,
    shapes: StageShapes,
    schedule: PipelineSchedule,
    microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    scale_grads: bool,
) -> PipelineScheduleSingle:
    """torch's schedule of this rank's (FSDP-sharded) stage over the pipeline group `pp`: `microbatches`
    pipeline micro-batches per `step()`, `loss_fn(logits, labels)` on each of them on the last stage.

    The shapes of the stage's input and output, and of their gradients (the hidden states' between stages),
    are given (`shapes`), so torch's metadata inference does not run: it would call `loss_fn` once more on
    the first step, on the first micro-batch outside the schedule's loop, and the mode's loss counts what it
    is called on (measured: L x 1.5 at K = 2 on the first step, and `sum`'s all-reduces one more)."""
    stage, stages = pp.get_local_rank(), pp.size()
    example_in, example_out = shapes.of(stage, stages)
    pipeline_stage = PipelineStage(
        stage_module,
        stage,
        stages,
        device,
        input_args=example_in,
        output_args=example_out,
        input_grads=None if stage == 0 else example_in.detach(),
        output_grads=None if stage == stages - 1 else example_out,
        group=pp.get_group(),
    )
    return SCHEDULES[schedule](pipeline_stage, n_microbatches=microbatches, loss_fn=loss_fn, scale_grads=scale_grads)
