"""`reduction=custom`: a callable of the user's turns each micro-batch shard's logits into the loss to backpropagate.

`custom.fn=MODULE:CALLABLE` (docs/trainers.md "Custom reductions") is called once per
micro-batch shard, in order m = 0 .. M-1, on every rank:

    fn(logits, labels, ctx) -> loss  or  (loss, logged)

- logits: [batch, seq, vocab], this rank's shard of micro-batch m, in the graph;
- labels: [batch, seq], contiguous, already shifted (labels[:, t] is the
  target of position t), IGNORE_INDEX (-100) where there is none;
- ctx: a `LossContext` (below): the layout, the step's token counts (N among
  them) and the process groups;
- loss: the 0-dim tensor the runner calls .backward() on, as it is. FSDP then
  reduces the gradients with `custom.fsdp_reduce` (mean over the W ranks, or sum);
- logged (optional): the value this shard's trainer would log (a number or a
  tensor, taken detached).

What the runner records, whatever the callable does: `loss` = L = sum S_rsm / N
(the runner's own token-sum cross-entropy of the same logits, outside the
graph, as every mode's); `reported_loss` = (1/W) sum_r sum_m logged_rm, the
logged values summed over micro-batches and averaged over the W ranks (L when
the callable logs nothing). Both travel in the one all-reduce per step that
`local` issues; N is all-reduced once per step before the first call. The
callable's own collectives are its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from runner.data.batches import IGNORE_INDEX, Batch
from runner.model.parallel import Meshes
from runner.modes import Reduction
from runner.train.all_reduce import quiet_torch_nn_deprecation
from runner.train.reduction import LossReducer, StepLoss, token_loss_sum


@dataclass(frozen=True)
class LossContext:
    """What a trainer knows when it computes one micro-batch shard's loss (W = dp * sp)."""

    world_size: int  # W: the ranks FSDP shards over and reduces gradients across
    dp: int
    sp: int
    rank: int  # in the world group
    dp_rank: int
    sp_rank: int
    grad_accum: int  # M, micro-batches per optimizer step
    micro_batch: int  # m, this call's micro-batch, 0 .. M-1
    global_tokens: int  # N: the step's valid targets over all ranks, shards and micro-batches
    shard_tokens: int  # n_rsm: this shard's valid targets
    sequence_tokens: int  # n_rm: valid targets of micro-batch m's whole sequences (all sp shards; = n_rsm at sp=1)
    rank_tokens: int  # this rank's valid targets over the step's micro-batches: sum_m n_rsm
    rank_sequence_tokens: int  # valid targets of this rank's whole sequences over the step: sum_m n_rm
    world_group: dist.ProcessGroup  # all W ranks
    dp_group: dist.ProcessGroup  # the ranks holding the other dp shards of the batch (same sp rank)
    sp_group: dist.ProcessGroup  # the ranks holding the other sp chunks of these sequences (same dp rank)
    ignore_index: int = IGNORE_INDEX


class CustomReducer(LossReducer):
    """The loss of `custom.fn` per micro-batch shard; L and the callable's logged value once per step."""

    def __init__(self, fn: Callable, spec: str, meshes: Meshes, grad_accum: int):
        super().__init__(Reduction.custom, meshes.world_group, grad_accum, sp=meshes.world["sp"].size())
        self.fn, self.spec, self.meshes = fn, spec, meshes
        self.rank = dist.get_rank(self.group)

    def start_step(self, valid_tokens: torch.Tensor) -> None:
        super().start_step(valid_tokens)
        self.global_tokens = int(valid_tokens.item())
        self.micro_batch = 0
        self.logs = False

    def plan_step(self, micro_batches: list[Batch]) -> None:
        self.rank_tokens = sum(mb.valid_tokens for mb in micro_batches)
        self.rank_sequence_tokens = sum(mb.whole_valid_tokens for mb in micro_batches)

    def micro_batch_loss(self, logits: torch.Tensor, labels: torch.Tensor, micro: Batch) -> torch.Tensor:
        with torch.no_grad():  # L, the loss every run records: S_rsm / N, outside the callable's graph
            self.loss_sum += token_loss_sum(logits.detach(), labels) / self.valid_tokens
        meshes = self.meshes
        ctx = LossContext(
            world_size=self.world_size,
            dp=self.dp,
            sp=self.sp,
            rank=self.rank,
            dp_rank=meshes.dp_rank,
            sp_rank=meshes.sp_rank,
            grad_accum=self.grad_accum,
            micro_batch=self.micro_batch,
            global_tokens=self.global_tokens,
            shard_tokens=micro.valid_tokens,
            sequence_tokens=micro.whole_valid_tokens,
            rank_tokens=self.rank_tokens,
            rank_sequence_tokens=self.rank_sequence_tokens,
            world_group=self.group,
            dp_group=meshes.world["dp"].get_group(),
            sp_group=meshes.sp_group,
        )
        returned = self.fn(logits, labels.contiguous(), ctx)  # an sp chunk is a column slice; trainers .view() it
        quiet_torch_nn_deprecation()  # a trainer's torch.distributed.nn call warned once (shown); not per micro-batch
        loss, logged = returned if isinstance(returned, tuple) else (returned, None)
        if not (isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.requires_grad):
            raise TypeError(
                f"custom.fn={self.spec} returned {type(loss).__name__}"
                + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else "")
                + "; it must return the loss to backpropagate (a 0-dim tensor in the graph), or (loss, logged)"
            )
        if logged is not None:
            self.mean_sum += torch.as_tensor(logged).detach().to(self.mean_sum)
            self.logs = True
        self.micro_batch += 1
        return loss

    def finish_step(self) -> StepLoss:
        # One collective per step carries L and the logged sum, as `local`'s carries L.
        loss, logged = funcol.all_reduce(torch.stack([self.loss_sum, self.mean_sum]), "sum", self.group).tolist()
        reported = logged / self.world_size if self.logs else loss
        return StepLoss(loss=loss, reported=reported, valid_tokens=self.global_tokens)
