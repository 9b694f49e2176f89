"""How each reduction mode turns a rank's token losses into the loss it backpropagates.

Notation for one optimizer step; W = world size = dp * sp, M = grad_accum.

    S_rsm  sum of token losses of rank (r, s)'s shard of micro-batch m (cross-entropy; with
           objective=pg, A_i x cross-entropy = -A_i log p: `runner.data.responses`)
           (dp rank r, sp rank s; with sp = 1 the shard is the whole micro-batch)
    n_rsm  its number of valid (non-ignored) targets
    n_rm   = sum_s n_rsm, the valid targets of micro-batch m's whole sequences
    N      = sum_rsm n_rsm, the step's global valid-token count (one all-reduce per step)
    L_rsm  = S_rsm / N
    L      = sum_rsm L_rsm, the global token-mean loss that every correct mode trains on

FSDP2 reduces gradients with a mean over the W ranks it shards over:
g = (1/W) sum_rs d(loss_rs)/dθ. AR is the differentiable all-reduce of
`autograd_all_reduce` (`runner.train.all_reduce`). `funcol` (the default) and
`torch_nn` all-reduce the incoming gradient with SUM in the backward, so with
every rank seeding 1, d AR(L_rsm) / d L_rsm = W on every rank; `identity`
passes it through, so it is 1, and `sum` then gets `local`'s dL / W.

| mode          | backpropagated per micro-batch | gradient after FSDP          | extra collectives / step |
|---------------|--------------------------------|------------------------------|--------------------------|
| sum           | AR(L_rsm)                      | (1/W) * W * dL = dL          | 2M (forward + backward)  |
|  [identity]   | AR(L_rsm), identity backward   | (1/W) * 1 * dL = dL / W      | M (forward only)         |
| detached      | L_rsm                          | dL / W                       | M (logging only)         |
| local         | L_rsm                          | dL / W                       | 1 (logging only)         |
| fsdp_sum      | L_rsm, FSDP sums (no 1/W)      | dL                           | 1 (logging only)         |
| scaled        | W * L_rsm                      | dL                           | 1 (logging only)         |
| mean_of_means | sp * S_rsm / n_rm / M          | d[(1/(dp M)) sum_rm S_rm/n_rm] | 1 (logging only)       |

`custom` calls the user's callable instead (`runner.train.custom`).

`mean_of_means` is the nanoGPT / Hugging Face (before 4.46) rule over whole
sequences: each micro-batch's token mean over its full sequences, averaged
over micro-batches and dp ranks. An sp shard holds part of its micro-batch's
sum S_rm = sum_s S_rsm, so it divides by the whole sequences' count n_rm (not
its own chunk's), and the factor sp undoes FSDP's mean over the sp ranks:
(1/W) sum_rsm sp S_rsm / (n_rm M) = (1/(dp M)) sum_rm S_rm / n_rm.

Every mode logs `loss` = L, computed from what that mode's loop already has:
sum_m AR(L_rsm) for `sum` (its forward values) and `detached`, AR(sum_m L_rsm)
once per step for the others. `reported` is what the mode's own loop would
print: L for all but `mean_of_means`, which reports
(1/dp) AR(sum_m S_rsm / n_rm / M) = (1/(dp M)) sum_rm S_rm / n_rm.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from runner.data.batches import IGNORE_INDEX, Batch
from runner.modes import AutogradAllReduce, Reduction
from runner.train.all_reduce import differentiable_all_reduce


@dataclass(frozen=True)
class StepLoss:
    loss: float  # L, the global token-mean loss
    reported: float  # what this mode's training loop reports
    valid_tokens: int  # N


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """S_rm: summed (not averaged) token loss over the valid targets: cross-entropy, or with objective=pg each
    target's A_i x cross-entropy = -A_i log p (`weights`, `runner.data.responses`).

    Logits sharded over the vocabulary (a DTensor, `loss_parallel` under tp) give torch's vocab-parallel cross
    entropy inside `vocab_parallel_loss`: its result is replicated on the tp ranks, so its local value is S_rm."""
    flat_logits, flat_labels = logits.flatten(0, 1).float(), labels.flatten()
    if weights is None:
        return _local(F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="sum"))
    losses = _local(F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="none"))
    return (losses * weights.flatten().to(losses.device)).sum()


def _local(value: torch.Tensor) -> torch.Tensor:
    return value.to_local() if isinstance(value, DTensor) else value


def vocab_parallel_loss(logits: torch.Tensor) -> AbstractContextManager:
    """torch's `loss_parallel()` for logits sharded over the vocabulary (its forward and backward both need it),
    else nothing."""
    return loss_parallel() if isinstance(logits, DTensor) else nullcontext()


def global_valid_tokens(micro_batches: list[Batch], group: dist.ProcessGroup, device: torch.device) -> torch.Tensor:
    """N: this rank's valid targets over all its micro-batches, summed over the world (one all-reduce)."""
    local = torch.tensor(sum(mb.valid_tokens for mb in micro_batches), dtype=torch.int64, device=device)
    dist.all_reduce(local, op=dist.ReduceOp.SUM, group=group)
    return local


class LossReducer:
    """Per-step state of one mode: `start_step` and `plan_step`, then `micro_batch_loss` per micro-batch, then
    `finish_gradients` and `finish_step` once."""

    def __init__(
        self,
        mode: Reduction,
        group: dist.ProcessGroup,
        grad_accum: int,
        sp: int = 1,
        autograd_all_reduce: AutogradAllReduce = AutogradAllReduce.funcol,
    ):
        self.mode = mode
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.grad_accum = grad_accum
        self.sp = sp
        self.dp = self.world_size // sp
        self.autograd_all_reduce = autograd_all_reduce

    def start_step(self, valid_tokens: torch.Tensor) -> None:
        self.valid_tokens = valid_tokens
        self.loss_sum = torch.zeros((), dtype=torch.float32, device=valid_tokens.device)  # sum_m L_rsm or its AR
        self.mean_sum = torch.zeros_like(self.loss_sum)  # sum_m S_rsm / n_rm / M

    def plan_step(self, micro_batches: list[Batch]) -> None:
        """This rank's micro-batches of the step, before the first: the runner's modes need nothing of them
        (a custom callable's context does: `runner.train.custom`)."""

    def micro_batch_loss(self, logits: torch.Tensor, labels: torch.Tensor, micro: Batch) -> torch.Tensor:
        """The loss to call .backward() on for one micro-batch shard, from its logits and (shifted) labels."""
        return self.backward_loss(token_loss_sum(logits, labels, micro.weights), micro.whole_valid_tokens)

    def backward_loss(self, token_loss: torch.Tensor, sequence_valid_tokens: int) -> torch.Tensor:
        """The loss to call .backward() on for one micro-batch shard, given S_rsm and n_rm."""
        local = token_loss / self.valid_tokens  # L_rsm = S_rsm / N
        mode = self.mode
        if mode is Reduction.sum:
            # Differentiable: a SUM backward all-reduces the seed, so L_rsm receives W (identity: 1).
            reduced = differentiable_all_reduce(local, self.group, self.autograd_all_reduce)
            self.loss_sum += reduced.detach()
            return reduced
        if mode is Reduction.detached:
            # The same forward value, but the collective is outside the graph.
            self.loss_sum += funcol.all_reduce(local.detach(), "sum", self.group)
            return local
        self.loss_sum += local.detach()
        if mode is Reduction.scaled:
            return self.world_size * local  # undoes FSDP's 1/W
        if mode is Reduction.mean_of_means:
            # nanoGPT-style: the micro-batch's token mean over its whole sequences, / M;
            # times sp so that FSDP's mean over W leaves the mean over dp ranks.
            mean = token_loss / max(sequence_valid_tokens, 1) / self.grad_accum
            self.mean_sum += mean.detach()
            return self.sp * mean
        return local  # local, fsdp_sum

    def finish_gradients(self, model: torch.nn.Module) -> None:
        """After the last backward (FSDP has reduced the gradients), before clipping and the optimizer: the
        runner's modes leave the gradients as they are (a custom rule's hook may not: `runner.train.custom`)."""

    def grad_norm(self) -> Callable[[list[torch.Tensor]], torch.Tensor] | None:
        """The step's global grad norm as a trainer computes it, or None for the runner's own (DTensor's): the
        runner's modes have none (a custom rule's `grad_norm` hook: `runner.train.custom`)."""
        return None

    def check_grad_norm(self) -> float | None:
        """After the optimizer step, outside its timed and counted phase: the gradient's true global norm where
        `grad_norm` gave a trainer's own (None: the runner's norm, DTensor's, was the one clipped with)."""
        return None

    def finish_step(self) -> StepLoss:
        if self.mode in (Reduction.sum, Reduction.detached):
            loss = reported = self.loss_sum.item()
        else:
            # One collective per step carries both L and the mean of means.
            both = funcol.all_reduce(torch.stack([self.loss_sum, self.mean_sum]), "sum", self.group)
            loss, mean_of_means = both.tolist()
            reported = mean_of_means / self.dp if self.mode is Reduction.mean_of_means else loss
        return StepLoss(loss=loss, reported=reported, valid_tokens=int(self.valid_tokens.item()))


def forward_backward(
    model: torch.nn.Module, micro_batches: list[Batch], reducer: LossReducer, device: torch.device
) -> StepLoss:
    """One optimizer step's gradients, accumulated over this rank's micro-batches."""
    reducer.start_step(global_valid_tokens(micro_batches, reducer.group, device))
    reducer.plan_step(micro_batches)
    for micro in micro_batches:
        logits = model(micro.inputs.to(device), position_offset=micro.position_offset)
        with vocab_parallel_loss(logits):
            reducer.micro_batch_loss(logits, micro.labels.to(device), micro).backward()
    reducer.finish_gradients(model)
    return reducer.finish_step()
