"""The reduction modes and what is known of each, in one place: the runner, the analysis and the plots read it.

W = world size = dp * sp; M = grad_accum; L = the global token-mean loss. The
math of each mode is written out in `runner.train.reduction`, next to the code.
FSDP's mean is over all W ranks with HSDP too (`dp_replicate` > 1: the mean
over a replica's shards, then over the replicas; `runner.model.parallel`), so
no fact below depends on dp_replicate.

| mode          | FSDP reduction | gradient   | role                | loss collectives per step    |
|---------------|----------------|------------|---------------------|------------------------------|
| sum           | mean           | grad L (*) | reference           | N, and M differentiable      |
| fsdp_sum      | sum            | grad L     | correct alternative | N, and 1 for logging         |
| scaled        | mean           | grad L     | correct alternative | N, and 1 for logging         |
| local         | mean           | grad L / W | the question        | N, and 1 for logging         |
| detached      | mean           | grad L / W | the question        | N, and M for logging         |
| mean_of_means | mean           | reweighted | negative control    | N, and 1 for logging         |
| custom        | custom.*       | measured   | custom              | N, 1 for logging, its own    |

(*) with a SUM-backward all-reduce (funcol, torch_nn); grad L / W with identity.
custom: FSDP's reduction is `custom.fsdp_reduce`.

`fsdp_sum` and `scaled` compute grad L with exactly `local`'s collectives:
they are the null control of the interleaved cost measurement. The enum's
order is the order of every table and plot.

`sum`'s gradient depends on which differentiable all-reduce it uses
(`autograd_all_reduce`, `AutogradAllReduce` below): `run_gradient` is the one
rule the runner's tests and the analysis' expected verdicts read. A `custom`
run's gradient is whatever its callable makes it: the analysis judges it by
what it measured, against `custom.expect` when given (`custom_expectation`).
A run's mode, as every table and plot names it, is `mode_label`: `sum`,
`sum[identity]`, `torchtitan [FSDP sum]` (a custom rule by `custom.name`, else
`custom:MODULE:CALLABLE`, with the settings that change its gradient).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from fractions import Fraction


class Reduction(str, Enum):
    """Loss-reduction modes, in report order: the reference, its correct alternatives, the question, the control."""

    sum = "sum"
    fsdp_sum = "fsdp_sum"
    scaled = "scaled"
    local = "local"
    detached = "detached"
    mean_of_means = "mean_of_means"
    custom = "custom"  # a callable of the user's (`custom.fn`); its facts are measured, not known


class AutogradAllReduce(str, Enum):
    """The differentiable all-reduce of the modes that have one in the graph (`sum`): `autograd_all_reduce`."""

    funcol = "funcol"
    torch_nn = "torch_nn"
    identity = "identity"


# What each implementation's backward does to the gradient arriving at its output, hence what a rank's
# local loss L_rsm receives when every rank seeds its reduced loss with 1: W (SUM) or 1 (identity).
# Measured in a gloo world by tests/test_all_reduce.py; the code is in `runner.train.all_reduce`.
ALL_REDUCE_BACKWARD: dict[AutogradAllReduce, str] = {
    AutogradAllReduce.funcol: "sum",
    AutogradAllReduce.torch_nn: "sum",
    AutogradAllReduce.identity: "identity",
}
ALL_REDUCE_SENTENCE: dict[AutogradAllReduce, str] = {
    AutogradAllReduce.funcol: "`funcol` is `torch.distributed._functional_collectives.all_reduce`, "
    "whose backward all-reduces the gradient with SUM, so each rank's loss receives W and FSDP's mean gives grad L.",
    AutogradAllReduce.torch_nn: "`torch_nn` is `torch.distributed.nn.functional.all_reduce` (as xtuner's ce_loss.py "
    "imports it), whose backward all-reduces the gradient with SUM, so each rank's loss receives W and FSDP's mean "
    "gives grad L.",
    AutogradAllReduce.identity: "`identity` all-reduces with SUM forward and passes the gradient through backward "
    "(Megatron's `_ReduceFromModelParallelRegion`), so each rank's loss receives 1 and FSDP's mean gives grad L / W, "
    "as `local`.",
}


# What a mode's gradient is, against grad L (the analysis' expected verdicts follow from it):
TRUE = "grad L"  # equivalent to the reference
OVER_W = "grad L / W"  # rescaled by 1/W (equivalent at W=1)
REWEIGHTED = "reweighted"  # another direction whenever micro-batches hold unequal valid-token counts
CUSTOM = "measured"  # a custom callable's: judged by what the run measured (against `custom.expect` when given)


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
    # FSDP's reduction is `custom.fsdp_reduce` (`fsdp_reduction_of`); the runner's own collectives are `local`'s.
    Reduction.custom: _facts("custom", "mean", CUSTOM, "#7f7f7f"),
}

MODES: list[str] = [mode.value for mode in Reduction]  # report and plot order
BUILT_IN: list[Reduction] = [mode for mode in Reduction if mode is not Reduction.custom]  # the runner's own math
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


# Config keys that make a run's mode (not its comparison group): the reduction, its all-reduce, its callable.
MODE_KEYS = ("reduction", "autograd_all_reduce", "custom.")


def has_graph_all_reduce(mode: str | Reduction) -> bool:
    """Whether `autograd_all_reduce` applies: the mode backpropagates through an all-reduce (`sum`)."""
    return facts(mode).differentiable_per_micro_batch


def run_gradient(mode: str | Reduction, autograd_all_reduce: str | AutogradAllReduce = "funcol") -> str:
    """A run's gradient against grad L (TRUE, OVER_W, REWEIGHTED or CUSTOM), given its all-reduce.

    With the all-reduce in the graph, each rank's L_rsm receives d(sum_r' L_r's)/dL_rsm from the
    backward: W when it all-reduces the gradient (SUM), 1 when it passes it through (identity).
    FSDP's mean then divides by W: grad L, or grad L / W (exactly `local`'s gradient).
    """
    backward = ALL_REDUCE_BACKWARD[AutogradAllReduce(autograd_all_reduce)]
    if has_graph_all_reduce(mode) and backward == "identity":
        return OVER_W
    return facts(mode).gradient


def fsdp_reduction_of(mode: str | Reduction, custom_fsdp_reduce: str = "mean") -> str:
    """FSDP's gradient reduction for a run: the mode's, or `custom.fsdp_reduce` for `custom`."""
    return custom_fsdp_reduce if Reduction(mode) is Reduction.custom else facts(mode).fsdp_reduction


def mode_label(
    mode: str | Reduction,
    autograd_all_reduce: str | AutogradAllReduce = "funcol",
    custom_fn: str | None = None,
    *,
    custom_name: str | None = None,
    custom_fsdp_reduce: str | None = None,
) -> str:
    """How tables and plots name a run's mode: `sum`, `sum[identity]`, `torchtitan [FSDP sum]`,
    `custom:MODULE:CALLABLE [FSDP mean]`: every setting that changes the run's gradient rule.

    The all-reduce is named only where it is not the default (`funcol`, the reference's): for `sum`, which
    has it in its graph, and for `custom`, whose rule may use it (`ctx.all_reduce`). A custom run is named by
    `custom.name` (the name people know the rule by) or its callable, then FSDP's reduction when given.
    """
    mode = Reduction(mode)
    implementation = AutogradAllReduce(autograd_all_reduce)
    non_default = implementation is not AutogradAllReduce.funcol
    if mode is Reduction.custom:
        settings = [f"FSDP {custom_fsdp_reduce}"] if custom_fsdp_reduce else []
        settings += [implementation.value] if non_default else []
        name = custom_name or f"custom:{custom_fn}"
        return f"{name} [{', '.join(settings)}]" if settings else name
    if has_graph_all_reduce(mode) and non_default:
        return f"{mode.value}[{implementation.value}]"
    return mode.value


def run_mode_label(cfg) -> str:
    """`mode_label` of a run config (typed or a DictConfig), reading only the keys its mode reads (so that a key
    it ignores stays unread: `runner.sweep.ignored`): a built-in mode's all-reduce where it has one in its graph,
    a custom rule's custom.* settings and all-reduce."""

    def value(v):
        return v.value if isinstance(v, Enum) else v

    mode = Reduction(value(cfg.reduction))
    if mode is not Reduction.custom:
        return mode_label(mode, value(cfg.autograd_all_reduce) if has_graph_all_reduce(mode) else "funcol")
    custom = cfg.custom
    return mode_label(
        mode,
        value(cfg.autograd_all_reduce),
        custom.fn,
        custom_name=custom.name,
        custom_fsdp_reduce=value(custom.fsdp_reduce),
    )


def label_order(label: str) -> tuple:
    """Sort key of mode labels: the modes' order, each `sum[...]` after `sum`, custom callables last by name."""
    label = str(label)  # an unreadable config's mode is missing (NaN): last
    base, _, rest = label.partition("[")
    if label.startswith("custom:"):
        return (len(MODES), 0, label)
    if base not in MODES:
        return (len(MODES) + 1, 0, label)
    variants = [a.value for a in AutogradAllReduce]
    variant = rest.rstrip("]")
    return (MODES.index(base), variants.index(variant) + 1 if variant in variants else 0, label)


EXPECTATIONS = "grad L, grad L / W, grad L x W, different, or a factor k > 0 of grad L (e.g. 0.5 or 1/2)"


def custom_expectation(expect: str, world_size: int) -> float | str:
    """`custom.expect` as the factor k of grad L it states at this world size, or "different".

    Raises ValueError (naming the valid forms, EXPECTATIONS) when it states neither.
    """
    text = " ".join(str(expect).replace("×", "x").replace("*", "x").split()).lower()
    named = {"grad l": 1.0, "grad l / w": 1.0 / world_size, "grad l x w": float(world_size), "different": "different"}
    if text in named:
        return named[text]
    try:
        factor = float(Fraction(text))
    except (ValueError, ZeroDivisionError):
        factor = float("nan")
    if not factor > 0:
        raise ValueError(f"{expect!r} is not an expectation; valid: {EXPECTATIONS}")
    return factor


NORM_FACTORS = "a factor k > 0 (e.g. 2 or 1/2) or sqrt(k) (e.g. sqrt(2))"


def grad_norm_factor(text: str) -> float:
    """`known_bug.ARM.grad_norm`: the factor it states on the grad norm against the reference's (sqrt(k) or k).

    Raises ValueError (naming the valid forms, NORM_FACTORS) when it states neither.
    """
    given = " ".join(str(text).split()).lower()
    root = given.startswith("sqrt(") and given.endswith(")")
    try:
        factor = float(Fraction(given[5:-1] if root else given))
    except (ValueError, ZeroDivisionError):
        factor = float("nan")
    if not factor > 0:
        raise ValueError(f"{text!r} is not a grad-norm factor; valid: {NORM_FACTORS}")
    return factor**0.5 if root else factor


# Colours of the labels that are not built-in modes (sum[...], custom:...), handed out in label order.
# Enough for experiment=trainers' sixteen rules (matplotlib's tab20 and Dark2 less the modes' own colours).
EXTRA_COLOURS = [
    "#2ca02c", "#8c564b", "#e377c2", "#bcbd22", "#ff9896", "#98df8a", "#c5b0d5", "#c49c94", "#dbdb8d",
    "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#aec7e8", "#ffbb78",
    "#f7b6d2", "#9edae5", "#393b79", "#637939", "#8c6d31", "#843c39",
]  # fmt: skip


def colours_for(labels) -> dict[str, str]:
    """A colour per mode label: a built-in mode's own, the others distinct ones (grey once they run out)."""
    others = sorted({str(label) for label in labels} - set(COLOURS), key=label_order)
    extra = {label: EXTRA_COLOURS[i] if i < len(EXTRA_COLOURS) else "grey" for i, label in enumerate(others)}
    return {**{label: COLOURS[label] for label in map(str, labels) if label in COLOURS}, **extra}


# Post-training aggregation (objective=pg): what a rule's objective weighs alike at W=1 grad_accum=1
# (`custom.weighs`), so which responses' tokens it weighs more than another objective does.
UNITS: dict[str, str] = {
    "token": "every response token alike: a long response weighs more in total",
    "response": "every response alike: a token weighs 1/|o_i|, short responses' tokens more",
    "prompt": "every prompt's group alike: a token weighs 1/(its group's tokens), short groups' tokens more",
}
LAYOUT_AXES = ("dp", "sp", "grad_accum")
LAYOUT_EXPECTATIONS = "invariant, x AXIS (a factor: dp, sp or grad_accum), or changes with AXIS[, AXIS] (direction)"


def layout_expectation(expect: str, dp: int, sp: int, grad_accum: int) -> float | str:
    """`custom.expect_layouts` at a layout, against the same rule at W=1 grad_accum=1: the factor k of that
    gradient it states (1.0: invariant), or "different" (another direction).

    `invariant`; `x sp` (the gradient times the layout's sp; likewise dp, grad_accum); `changes with dp,
    grad_accum` (another direction wherever one of those is above 1, the same gradient elsewhere).
    Raises ValueError (naming the valid forms) for anything else.
    """
    text = " ".join(str(expect).replace("×", "x").split()).lower()
    sizes = {"dp": dp, "sp": sp, "grad_accum": grad_accum}
    if text == "invariant":
        return 1.0
    if text.startswith("x ") and text[2:] in sizes:
        return float(sizes[text[2:]])
    if text.startswith("changes with "):
        axes = [axis.strip() for axis in text[len("changes with ") :].split(",")]
        if axes and all(axis in sizes for axis in axes):
            return "different" if any(sizes[axis] > 1 for axis in axes) else 1.0
    raise ValueError(f"{expect!r} is not a layout expectation; valid: {LAYOUT_EXPECTATIONS}")


def unit_problem(weighs: str) -> str | None:
    """Why `custom.weighs` is not one of UNITS (None: it is)."""
    return None if weighs in UNITS else f"{weighs!r} is not one of {', '.join(UNITS)}"


def heavier_tokens(unit: str, than: str) -> str | None:
    """Which tokens an objective that weighs `unit` alike weighs more than one that weighs `than` alike (both
    UNITS), in words; None where the two weigh tokens alike (the gradients differ by a factor at most)."""
    words = {
        ("token", "response"): "long responses' tokens",
        ("token", "prompt"): "the tokens of long groups",
        ("response", "token"): "short responses' tokens",
        ("response", "prompt"): "the tokens of responses short for their group",
        ("prompt", "token"): "the tokens of short groups",
        ("prompt", "response"): "the tokens of responses long for their group",
    }
    return None if unit == than else words[(unit, than)]
