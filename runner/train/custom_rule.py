"""The protocol of a `custom.fn` rule: what it is called with, what it may return, its optional hooks.

`custom.fn=MODULE:CALLABLE` names the rule. The runner calls it once per
micro-batch shard, in order m = 0 .. M-1, on every rank:

    fn(logits, labels, ctx: LossContext) -> loss  or  (loss, logged)

- loss: the 0-dim floating tensor in the graph that the runner calls .backward() on;
- logged (optional): what this shard's trainer would log, taken detached: a number
  (the runner sums it over micro-batches and averages over the W ranks), or a
  (numerator, denominator) pair (summed over micro-batches and ranks, then divided:
  Megatron-LM's [loss sum, tokens]). Both kinds travel in the runner's one logging
  all-reduce per step.

The rule may carry attributes (set them with `custom_rule`, or by hand):

- `start_step(ctx: StepContext) -> plan`: once per step, before the first
  micro-batch, with this rank's labels of every micro-batch of the step (as
  xtuner's `build_batches` or the Hugging Face Trainer's `get_batch_samples`
  see them); it may issue collectives. What it returns is `ctx.plan` in every
  call of the step.
- `finish_gradients(model, ctx: StepContext)`: once per step, after the last
  backward (FSDP has reduced the gradients) and before clipping and the
  optimizer: Megatron-LM's `finalize_model_grads` scales them by 1/num_tokens here.
- `grad_norm(grads, ctx: StepContext) -> norm`: once per step, after
  `finish_gradients`, with this rank's gradients (FSDP's DTensors): the global
  norm as the trainer computes it (a 0-dim tensor, the same on every rank),
  which the runner then logs as `grad_norm` and clips with (`optim.clip`)
  instead of its own (`runner.train.gradients`): a trainer's own reduction of
  the squared norms, over the process group it chose.
- `graph_all_reduce`: the differentiable all-reduce the rule puts in the graph,
  an `AutogradAllReduce` value, or "configured" for `ctx.all_reduce` (which uses
  `autograd_all_reduce`); the runner measures its backward once at the start.
- `upstream`: the code the rule runs or follows (`Package`: an installed
  package's functions, recorded with the version that ran; `Source`: a
  paraphrase of a repository's files at a commit; `Paper`: a published
  objective written out), and the tests of this repository that hold it, or
  a part of it, against upstream (`Tested`: the kind of evidence, the test,
  what it is compared with), recorded in summary.json (`custom_upstream`:
  `runner.train.upstream`); the analysis derives the kinds of evidence from
  them (`analysis.load.provenance`).

Whatever the rule returns is checked, and whatever it raises (in the call or
a hook) is reported as the rule's, naming the cause: a number or integer
tensor, a detached tensor, a tuple of the wrong length, a collective of its
own that timed out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from runner.config import ObjectiveConfig
from runner.data.batches import IGNORE_INDEX, Responses
from runner.modes import AutogradAllReduce
from runner.train.all_reduce import differentiable_all_reduce
from runner.train.upstream import Package, Paper, Source, Tested  # noqa: F401  (the protocol's names)

CONFIGURED = "configured"  # graph_all_reduce: the rule uses ctx.all_reduce, i.e. `autograd_all_reduce`
HOOKS = ("start_step", "finish_gradients", "grad_norm")


@dataclass(frozen=True, kw_only=True)
class StepContext:
    """What a trainer knows of the whole step on this rank (W = dp * sp; M = grad_accum)."""

    world_size: int  # W: the ranks FSDP shards over and reduces gradients across
    dp: int
    sp: int
    rank: int  # in the world group
    dp_rank: int
    sp_rank: int
    grad_accum: int  # M, micro-batches per optimizer step
    global_tokens: int  # N: the step's valid targets over all ranks, shards and micro-batches
    rank_tokens: int  # this rank's valid targets over the step's micro-batches: sum_m n_rsm
    rank_sequence_tokens: int  # valid targets of this rank's whole sequences over the step: sum_m n_rm
    labels: tuple[torch.Tensor, ...]  # this rank's shard of each micro-batch's labels (shifted), m = 0 .. M-1
    sequence_labels: tuple[torch.Tensor, ...]  # the whole sequences' labels of each micro-batch (all sp chunks)
    world_group: dist.ProcessGroup  # all W ranks
    dp_group: dist.ProcessGroup  # the ranks holding the other dp shards of the batch (same sp rank)
    sp_group: dist.ProcessGroup  # the ranks holding the other sp chunks of these sequences (same dp rank)
    device: torch.device  # where this rank's model and collectives live (labels stay on the CPU)
    sequences: int = 0  # the step's sequences over all ranks and micro-batches (train.global_batch)
    # objective=pg (`runner.data.responses`): the objective's settings (group_size, prompt_len, max_response), and
    # each micro-batch's responses, one per row of this rank's rows (advantage, group, |o_i| over all sp chunks,
    # first target's column, index in the step); None for objective=ce.
    objective: ObjectiveConfig | None = None
    responses: tuple[Responses, ...] | None = None
    autograd_all_reduce: AutogradAllReduce = AutogradAllReduce.funcol
    ignore_index: int = IGNORE_INDEX
    plan: Any = None  # what the rule's start_step returned for this step

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """sum over the W ranks, differentiable, with `autograd_all_reduce`'s backward (`runner.train.all_reduce`)."""
        return differentiable_all_reduce(tensor, self.world_group, self.autograd_all_reduce)


@dataclass(frozen=True, kw_only=True)
class LossContext(StepContext):
    """What a trainer knows when it computes one micro-batch shard's loss."""

    micro_batch: int  # m, this call's micro-batch, 0 .. M-1
    shard_tokens: int  # n_rsm: this shard's valid targets
    sequence_tokens: int  # n_rm: valid targets of micro-batch m's whole sequences (all sp shards; = n_rsm at sp=1)

    @property
    def whole_labels(self) -> torch.Tensor:
        """The labels of micro-batch m's whole sequences (all sp chunks)."""
        return self.sequence_labels[self.micro_batch]

    @property
    def micro_responses(self) -> Responses:
        """objective=pg: the responses of micro-batch m's rows (row k of `labels` is response k here)."""
        if self.responses is None:
            raise ValueError("this run's objective has no responses (objective=ce); run it with objective=pg")
        return self.responses[self.micro_batch]


def custom_rule(*, upstream=(), start_step=None, finish_gradients=None, grad_norm=None, graph_all_reduce=None):
    """Decorate a rule fn(logits, labels, ctx) with its hooks and facts (module docstring)."""
    if graph_all_reduce is not None and graph_all_reduce != CONFIGURED:
        graph_all_reduce = AutogradAllReduce(graph_all_reduce)

    def decorate(fn):
        fn.upstream = tuple(upstream)
        fn.start_step = start_step
        fn.finish_gradients = finish_gradients
        fn.grad_norm = grad_norm
        fn.graph_all_reduce = graph_all_reduce
        return fn

    return decorate


def graph_all_reduce_of(fn, configured: Callable[[], AutogradAllReduce]) -> AutogradAllReduce | None:
    """The differentiable all-reduce a rule declares in its graph (None: none declared); `configured` gives
    `autograd_all_reduce`, read only for a rule that declares "configured"."""
    declared = getattr(fn, "graph_all_reduce", None)
    if declared is None:
        return None
    return configured() if declared == CONFIGURED else AutogradAllReduce(declared)


class CustomRuleError(RuntimeError):
    """A custom rule returned something the runner cannot backpropagate, or raised; the message names the cause."""


def checked_loss(returned: object, spec: str) -> tuple[torch.Tensor, object]:
    """(loss, logged) from what the rule returned; raises CustomRuleError naming what is wrong with it."""
    shape = "return the loss to backpropagate (a 0-dim floating tensor in the graph), or (loss, logged)"
    if isinstance(returned, tuple):
        if len(returned) != 2:
            raise CustomRuleError(f"custom.fn={spec} returned a tuple of {len(returned)} values; {shape}")
        loss, logged = returned
    else:
        loss, logged = returned, None
    if not isinstance(loss, torch.Tensor):
        raise CustomRuleError(
            f"custom.fn={spec} returned a {type(loss).__name__} ({loss!r}) as the loss: a number has no gradient "
            f"(was it taken with .item() or float()?); {shape}"
        )
    if loss.dim() != 0:
        raise CustomRuleError(
            f"custom.fn={spec} returned a loss of shape {tuple(loss.shape)}; reduce it to one value (.sum() or "
            f".mean()): {shape}"
        )
    if not (loss.dtype.is_floating_point or loss.dtype.is_complex):
        raise CustomRuleError(
            f"custom.fn={spec} returned an integer loss ({loss.dtype}): integer tensors carry no gradient "
            f"(a count, or an argmax?); {shape}"
        )
    if not loss.requires_grad:
        raise CustomRuleError(
            f"custom.fn={spec} returned a detached loss (requires_grad=False): it was .detach()ed, computed under "
            f"torch.no_grad(), or built from numbers; {shape}"
        )
    return loss, logged


def logged_parts(logged: object, spec: str) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor | None:
    """The rule's logged value as a 1-element tensor (detached, float64, where it lives: no host sync), or a
    (numerator, denominator) pair of them, or None."""
    if logged is None:
        return None
    if isinstance(logged, (tuple, list)):
        if len(logged) != 2:
            raise CustomRuleError(
                f"custom.fn={spec} logged a sequence of {len(logged)} values; log a number, or a "
                "(numerator, denominator) pair"
            )
        return tuple(_one_value(part, spec) for part in logged)
    return _one_value(logged, spec)


def _one_value(value: object, spec: str) -> torch.Tensor:
    tensor = torch.as_tensor(value).detach()
    if tensor.numel() != 1:
        raise CustomRuleError(f"custom.fn={spec} logged a value of shape {tuple(tensor.shape)}; log one number")
    return tensor.reshape(()).to(torch.float64)


def is_timeout(error: BaseException) -> bool:
    """Whether `error` is a collective that timed out (gloo and NCCL say so in the message)."""
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("timed out" in text or "timeout" in text)


def rule_failure(spec: str, where: str, error: BaseException, timeout_s: float) -> CustomRuleError:
    """What the rule did wrong, in words: a collective of its own that timed out, or what it raised."""
    if is_timeout(error):
        return CustomRuleError(
            f"custom.fn={spec}: a collective it issued in {where} timed out after dist.timeout_s={timeout_s:g} s: "
            "every rank of its group must call it, in the same order (a branch on the rank, or on a count that "
            f"differs between ranks, skips it on some). {type(error).__name__}: {str(error).splitlines()[0]}"
        )
    return CustomRuleError(f"custom.fn={spec} raised in {where}: {type(error).__name__}: {error}")


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN for 0 / 0 (a logged pair over no tokens), +-inf for x / 0."""
    if denominator == 0:
        return math.nan if numerator == 0 else math.copysign(math.inf, numerator)
    return numerator / denominator
