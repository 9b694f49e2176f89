"""`reduction=custom`: a rule of the user's (or a trainer's, `runner.trainers`) turns each micro-batch shard's
logits into the loss to backpropagate; the protocol (contexts, hooks, what may be returned) is
`runner.train.custom_rule`'s.

Per step, on every rank: N is all-reduced once (the runner's, before the first
micro-batch); the rule's `start_step` hook, if any; the rule on each micro-batch
shard, each loss backpropagated as returned (FSDP then reduces the gradients with
`custom.fsdp_reduce`); the rule's `finish_gradients` hook, if any, before
clipping and the optimizer; the rule's `grad_norm` hook, if any, in place of the runner's norm (logged and
clipped with); one all-reduce that carries the runner's L and the
rule's logged values.

What the runner records, whatever the rule does: `loss` = L = sum S_rsm / N
(the runner's own token-sum cross-entropy of the same logits, outside the
graph, as every mode's); `reported_loss` = what the rule logs: (1/W) sum_r sum_m
logged_rm for numbers, sum num / sum den for (numerator, denominator) pairs, L
when it logs nothing. A rule's own collectives come on top of the runner's two.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import DTensor

from runner.config import ObjectiveConfig
from runner.data.batches import Batch
from runner.model.parallel import Meshes
from runner.modes import AutogradAllReduce, Reduction
from runner.train.all_reduce import quiet_torch_nn_deprecation
from runner.train.custom_rule import (
    CustomRuleError,
    LossContext,
    StepContext,
    checked_loss,
    logged_parts,
    ratio,
    rule_failure,
)
from runner.train.gradients import owned_square_sum
from runner.train.reduction import LossReducer, StepLoss, token_loss_sum

STEP_FIELDS = [f.name for f in fields(StepContext)]


class CustomReducer(LossReducer):
    """The rule's loss per micro-batch shard, its hooks around them; L and its logged value once per step."""

    def __init__(
        self,
        fn: Callable,
        spec: str,
        meshes: Meshes,
        grad_accum: int,
        autograd_all_reduce: AutogradAllReduce = AutogradAllReduce.funcol,
        timeout_s: float = 300.0,
        objective: ObjectiveConfig | None = None,
        sequences: int = 0,
    ):
        super().__init__(Reduction.custom, meshes.world_group, grad_accum, sp=meshes.world["sp"].size())
        self.fn, self.spec, self.meshes = fn, spec, meshes
        self.autograd_all_reduce, self.timeout_s = autograd_all_reduce, timeout_s
        self.objective, self.sequences = objective, sequences  # objective=pg's settings (None for ce); G_b
        self.rank = dist.get_rank(self.group)
        self.start_hook = getattr(fn, "start_step", None)
        self.finish_hook = getattr(fn, "finish_gradients", None)
        self.norm_hook = getattr(fn, "grad_norm", None)

    def start_step(self, valid_tokens: torch.Tensor) -> None:
        super().start_step(valid_tokens)
        self.global_tokens = int(valid_tokens.item())
        self.micro_batch = 0
        self.logged_kind: str | None = None  # "number" or "pair", once the rule logs
        # sum of logged numbers; sum of numerators; sum of denominators (where N lives: no host sync per micro-batch)
        self.logged = torch.zeros(3, dtype=torch.float64, device=valid_tokens.device)

    def plan_step(self, micro_batches: list[Batch]) -> None:
        meshes = self.meshes
        context = StepContext(
            world_size=self.world_size,
            dp=self.dp,
            sp=self.sp,
            rank=self.rank,
            dp_rank=meshes.dp_rank,
            sp_rank=meshes.sp_rank,
            grad_accum=self.grad_accum,
            global_tokens=self.global_tokens,
            rank_tokens=sum(mb.valid_tokens for mb in micro_batches),
            rank_sequence_tokens=sum(mb.whole_valid_tokens for mb in micro_batches),
            labels=tuple(mb.labels.contiguous() for mb in micro_batches),
            sequence_labels=tuple(mb.whole_labels for mb in micro_batches),
            world_group=self.group,
            dp_group=meshes.world["dp"].get_group(),
            sp_group=meshes.sp_group,
            device=self.valid_tokens.device,
            sequences=self.sequences,
            objective=self.objective,
            responses=None if self.objective is None else ReadResponses(mb.responses for mb in micro_batches),
            autograd_all_reduce=self.autograd_all_reduce,
        )
        if self.start_hook is not None:
            plan = self._call("its start_step hook", self.start_hook, context)
            context = StepContext(**{**_shallow(context), "plan": plan})
        self.context = context

    def micro_batch_loss(self, logits: torch.Tensor, labels: torch.Tensor, micro: Batch) -> torch.Tensor:
        with torch.no_grad():  # L, the loss every run records: S_rsm / N, outside the rule's graph
            self.loss_sum += token_loss_sum(logits.detach(), labels, micro.weights) / self.valid_tokens
        ctx = LossContext(
            **_shallow(self.context),
            micro_batch=self.micro_batch,
            shard_tokens=micro.valid_tokens,
            sequence_tokens=micro.whole_valid_tokens,
        )
        where = f"micro-batch {self.micro_batch}"
        returned = self._call(where, self.fn, logits, labels.contiguous(), ctx)  # an sp chunk is a column slice
        quiet_torch_nn_deprecation()  # a trainer's torch.distributed.nn call warned once (shown); not per micro-batch
        loss, logged = checked_loss(returned, self.spec)
        self._add_logged(logged_parts(logged, self.spec))
        self.micro_batch += 1
        return loss

    def finish_gradients(self, model: torch.nn.Module) -> None:
        if self.finish_hook is not None:
            self._call("its finish_gradients hook", self.finish_hook, model, self.context)

    def grad_norm(self) -> Callable[[list[torch.Tensor]], torch.Tensor] | None:
        if self.norm_hook is None:
            return None

        def norm(grads: list[torch.Tensor]) -> torch.Tensor:
            value = self._call("its grad_norm hook", self.norm_hook, grads, self.context)
            shown = value.full_tensor() if isinstance(value, DTensor) else torch.as_tensor(value)
            # what check_grad_norm compares across the ranks, after the step: no collective here
            self.norm_seen = torch.stack([shown.detach().double().reshape(()).cpu(), owned_square_sum(grads).cpu()])
            return value

        return norm

    def check_grad_norm(self) -> float | None:
        """The hook's norm must be the world's (each rank clips with it) and finite where the gradient is: both
        checked, with one all-gather of (the hook's norm, the rank's share of the true squared norm); the true
        norm is returned for the record (`true_grad_norm`), so the analysis can say what the hook's is to it."""
        if self.norm_hook is None:
            return None
        device = self.valid_tokens.device
        seen = torch.empty(self.world_size * 2, dtype=torch.float64, device=device)
        dist.all_gather_into_tensor(seen, self.norm_seen.to(device), group=self.group)
        hooks, squares = seen.view(self.world_size, 2).unbind(1)
        true = squares.sum().sqrt().item()
        values = hooks.tolist()
        hook = f"custom.fn={self.spec}'s grad_norm hook"
        if not all(math.isfinite(v) for v in values) and math.isfinite(true):
            raise CustomRuleError(
                f"{hook} returned {values[self.rank]} while the gradient's norm is {true:.6g}: the hook, not the "
                "training, gave a norm that is not finite"
            )
        if len({v for v in values if not math.isnan(v)}) > 1:
            raise CustomRuleError(
                f"{hook} returned a different norm on each rank ({min(values):.6g} to {max(values):.6g}): each rank "
                "would clip by its own factor; return the world's norm, the same on every rank"
            )
        return true

    def finish_step(self) -> StepLoss:
        responses = self.context.responses
        if isinstance(responses, ReadResponses) and not responses.read:
            raise CustomRuleError(
                f"custom.fn={self.spec} read no response (ctx.responses, ctx.micro_responses) in this step: under "
                "objective=pg its loss is not the policy-gradient objective (a cross-entropy of the labels trains "
                "the responses' likelihood, advantages unread) though the run's loss logs -A log p; give "
                "objective=ce for this rule, or a rule that weighs each response by its advantage"
            )
        # One collective per step carries L and the logged values, as `local`'s carries L.
        carried = torch.cat([self.loss_sum.double().reshape(1), self.logged])
        loss, number, numerator, denominator = funcol.all_reduce(carried, "sum", self.group).tolist()
        reported = {"number": number / self.world_size, "pair": ratio(numerator, denominator)}.get(
            self.logged_kind, loss
        )
        return StepLoss(loss=loss, reported=reported, valid_tokens=self.global_tokens)

    def _add_logged(self, parts) -> None:
        if parts is None:
            return
        kind = "pair" if isinstance(parts, tuple) else "number"
        if self.logged_kind not in (None, kind):
            raise CustomRuleError(f"custom.fn={self.spec} logged numbers and pairs in one step; log one kind")
        self.logged_kind = kind
        device = self.logged.device
        if kind == "number":
            self.logged[0] += parts.to(device)
        else:
            self.logged[1] += parts[0].to(device)
            self.logged[2] += parts[1].to(device)

    def _call(self, where: str, hook: Callable, *args):
        try:
            return hook(*args)
        except CustomRuleError:
            raise
        except Exception as error:
            raise rule_failure(self.spec, where, error, self.timeout_s) from error


class ReadResponses(tuple):
    """objective=pg's responses of the step's micro-batches, which note whether the rule (or its hook) read them:
    a rule that never does computes no policy-gradient loss, whatever `loss` logs."""

    read = False

    def __getitem__(self, index):
        self.read = True
        return super().__getitem__(index)

    def __iter__(self):
        self.read = True
        return super().__iter__()


def _shallow(context: StepContext) -> dict:
    """A context's step fields, as they are (dataclasses.asdict would deep-copy the tensors and groups)."""
    return {name: getattr(context, name) for name in STEP_FIELDS}
