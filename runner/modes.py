"""The reduction modes and what is known of each, in one place: the runner, the analysis and the plots read it.

W = world size = dp * sp; M = grad_accum; L = the global token-mean loss. The
math of each mode is written out in `runner.train.reduction`, next to the code.

| mode          | FSDP reduction | gradient   | role                | loss collectives per step    |
|---------------|----------------|------------|---------------------|------------------------------|
| sum           | mean           | grad L     | reference           | N, and M differentiable      |
| fsdp_sum      | sum            | grad L     | correct alternative | N, and 1 for logging         |
| scaled        | mean           | grad L     | correct alternative | N, and 1 for logging         |
| local         | mean           | grad L / W | the question        | N, and 1 for logging         |
| detached      | mean           | grad L / W | the question        | N, and M for logging         |
| mean_of_means | mean           | reweighted | negative control    | N, and 1 for logging         |

`fsdp_sum` and `scaled` compute grad L with exactly `local`'s collectives:
they are the null control of the interleaved cost measurement. The enum's
order is the order of every table and plot.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Reduction(str, Enum):
    """Loss-reduction modes, in report order: the reference, its correct alternatives, the question, the control."""

    sum = "sum"
    fsdp_sum = "fsdp_sum"
    scaled = "scaled"
    local = "local"
    detached = "detached"
    mean_of_means = "mean_of_means"


# What a mode's gradient is, against grad L (the analysis' expected verdicts follow from it):
TRUE = "grad L"  # equivalent to the reference
OVER_W = "grad L / W"  # rescaled by 1/W (equivalent at W=1)
REWEIGHTED = "reweighted"  # another direction whenever micro-batches hold unequal valid-token counts


@dataclass(frozen=True)
class ModeFacts:
    role: str  # "reference", "correct alternative", "question" or "negative control"
    fsdp_reduction: str  # "mean" (FSDP2's default, ReduceOp.AVG) or "sum"
    gradient: str  # TRUE, OVER_W or REWEIGHTED
    # Loss all-reduces of one step, by kind (`runner.measure.floor` times each kind), as a function of M:
    # plain: N's dist.all_reduce; functional: a waited funcol.all_reduce (logging);
    # differentiable: a funcol.all_reduce in the graph, forward + backward.
    functional_per_micro_batch: bool  # detached logs each micro-batch's loss; the others reduce once per step
    differentiable_per_micro_batch: bool  # sum backpropagates through an all-reduce per micro-batch
    null_control: bool  # local's collectives and grad L: the cost measurement's null arms
    colour: str  # in every plot

    def loss_collectives(self, grad_accum: int) -> dict[str, int]:
        """The all-reduces of one step's forward/backward, by kind."""
        if self.differentiable_per_micro_batch:
            return {"plain": 1, "functional": 0, "differentiable": grad_accum}
        return {"plain": 1, "functional": grad_accum if self.functional_per_micro_batch else 1, "differentiable": 0}

    def gradient_factor(self, world_size: int) -> float | None:
        """The mode's gradient as a multiple of grad L (None: not a multiple of it)."""
        return {TRUE: 1.0, OVER_W: 1.0 / world_size}.get(self.gradient)


def _facts(role, fsdp_reduction, gradient, colour, *, functional=False, differentiable=False, null=False) -> ModeFacts:
    return ModeFacts(role, fsdp_reduction, gradient, functional, differentiable, null, colour)


FACTS: dict[Reduction, ModeFacts] = {
    Reduction.sum: _facts("reference", "mean", TRUE, "#000000", differentiable=True),
    Reduction.fsdp_sum: _facts("correct alternative", "sum", TRUE, "#1f77b4", null=True),
    Reduction.scaled: _facts("correct alternative", "mean", TRUE, "#17becf", null=True),
    Reduction.local: _facts("question", "mean", OVER_W, "#d62728"),
    Reduction.detached: _facts("question", "mean", OVER_W, "#ff7f0e", functional=True),
    Reduction.mean_of_means: _facts("negative control", "mean", REWEIGHTED, "#9467bd"),
}

MODES: list[str] = [mode.value for mode in Reduction]  # report and plot order
COLOURS: dict[str, str] = {mode.value: FACTS[mode].colour for mode in Reduction}


def facts(mode: str | Reduction) -> ModeFacts:
    return FACTS[Reduction(mode)]


def modes_where(**wanted: object) -> list[str]:
    """The modes whose facts have every given value, in report order: `modes_where(gradient=OVER_W)`."""
    return [
        mode.value for mode in Reduction if all(getattr(FACTS[mode], key) == value for key, value in wanted.items())
    ]


def with_extra_collectives() -> list[str]:
    """The modes that issue more loss collectives than `local` (whose time cost the question weighs)."""
    local = FACTS[Reduction.local].loss_collectives(2)  # M = 2 tells per-micro-batch from per-step collectives
    return [mode.value for mode in Reduction if FACTS[mode].loss_collectives(2) != local]
