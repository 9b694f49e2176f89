"""The rules of pipeline parallelism (`pp` > 1), checked before any rank starts.

The stages (`runner.model.pipeline_parallel`) are cut from the runner's own decoder: its blocks split into pp
contiguous runs, the embedding on the first stage and the final norm and head on the last, so a Hugging Face
model (no such cut is written for it) and a tied head (one weight on two stages) are refused, and every stage
needs at least one layer. The schedule (torch's `ScheduleGPipe` or `Schedule1F1B`, `runner.train.pipeline_step`)
splits each gradient-accumulation micro-batch of a dp rank into `pp_microbatches` pipeline micro-batches of
equal rows, so those rows must divide evenly; Schedule1F1B also refuses fewer micro-batches than stages (its
constructor raises). What is not built inside a pipeline yet is refused rather than run wrong: Ulysses (sp)
and tensor parallelism (tp) within a stage, the interleaved cost loop (`cost.modes`), and objective=pg (the
schedule splits the targets it is given, not the per-token advantages beside them). The built-in modes are
judged at pp > 1; a custom rule's collectives and counts are written against groups of all W ranks, and its
hooks see every micro-batch on every rank (`runner.train.custom_rule`), which a pipeline splits over stages
and pipeline micro-batches, so it is refused. The layout's own rules (pp dividing world_size, the global
batch splitting over dp x grad_accum) are `runner.layout`'s.
"""

from __future__ import annotations

from omegaconf import DictConfig

from runner.config import PipelineSchedule
from runner.layout import divisors
from runner.model.hf_config import ModelShape

Problems = list[tuple[str, str]]


def _is_1f1b(cfg: DictConfig) -> bool:
    return cfg.pp_schedule.value == PipelineSchedule.one_f_one_b.value


def _microbatches_named(cfg: DictConfig) -> str:
    """pp_microbatches as the user gave it: its value, or null with the pp it stands for."""
    given = cfg.pp_microbatches
    return f"pp_microbatches={given}" if given is not None else f"pp_microbatches=null (pp={cfg.pp} of them)"


def _rows_per_micro_batch(cfg: DictConfig) -> tuple[int, str] | None:
    """(R, its formula): the rows of one gradient-accumulation micro-batch on a dp rank, where the layout splits
    evenly (else None: the layout's rules report it)."""
    model_ranks = cfg.sp * cfg.tp * cfg.pp
    if cfg.world_size % model_ranks:
        return None
    dp = cfg.world_size // model_ranks
    split = dp * cfg.grad_accum
    if dp < 1 or cfg.train.global_batch % split:
        return None
    rows = cfg.train.global_batch // split
    formula = (
        f"train.global_batch / (dp x grad_accum) = {cfg.train.global_batch} / ({dp} x {cfg.grad_accum}) = {rows}, "
        f"with dp = world_size / (sp x tp x pp) = {cfg.world_size} / ({cfg.sp} x {cfg.tp} x {cfg.pp}) = {dp}"
    )
    return rows, formula


def _valid_microbatches(cfg: DictConfig, rows: int) -> list[int]:
    """The pipeline micro-batch counts that split `rows` evenly (and, for 1F1B, are at least the stages)."""
    return [d for d in divisors(rows) if not _is_1f1b(cfg) or d >= cfg.pp]


def _schedule_problems(cfg: DictConfig) -> Problems:
    pp, microbatches = cfg.pp, cfg.pp_microbatches or cfg.pp
    schedule = f"pp_schedule={cfg.pp_schedule.value}"
    found: Problems = []
    rows = _rows_per_micro_batch(cfg)
    if rows is not None and rows[0] % microbatches:
        rows_value, formula = rows
        valid = _valid_microbatches(cfg, rows_value)
        shown = (
            ", ".join(map(str, valid))
            if valid
            else f"none with {schedule} (fewer rows than pp={pp} stages): use pp_schedule=gpipe or a larger "
            "train.global_batch"
        )
        found.append(
            (
                "pp_microbatches",
                f"{_microbatches_named(cfg)} cannot split the {rows_value} rows of one gradient-accumulation "
                f"micro-batch on a dp rank ({formula}) into equal pipeline micro-batches; "
                f"valid pp_microbatches{' with ' + schedule if _is_1f1b(cfg) else ''}: {shown}",
            )
        )
    if _is_1f1b(cfg) and microbatches < pp:
        valid = ""
        if rows is not None:
            counts = _valid_microbatches(cfg, rows[0])
            valid = (
                f" (valid: {', '.join(map(str, counts))})" if counts else f" (none: {rows[0]} rows, fewer than {pp})"
            )
        found.append(
            (
                "pp_microbatches",
                f"pp_microbatches={microbatches} with {schedule} and pp={pp}: torch's Schedule1F1B needs at least as "
                f"many micro-batches as stages; use pp_microbatches >= {pp}{valid} or pp_schedule=gpipe",
            )
        )
    return found


def pipeline_parallel_problems(cfg: DictConfig, shape: ModelShape | None) -> Problems:
    """(field, message) for every pipeline rule the config breaks; [] at pp = 1.

    `shape` is the model's (None where it has no valid shape: its layers are then `model.n_layers`'s); a
    Hugging Face model is refused before its layers matter, so the layers are always the own decoder's.
    """
    pp = cfg.pp
    if pp == 1:
        return []
    if cfg.model.arch.value == "hf":
        return [
            (
                "pp",
                f"pp={pp} is built for the runner's own decoder (model=tiny, small or gpt2_124m), whose blocks its "
                f"stages cut; model={cfg.model.name} is a Hugging Face model: use pp=1 with it",
            )
        ]
    found: Problems = []
    if cfg.reduction.value == "custom":
        found.append(
            (
                "pp",
                f"pp={pp} is judged for the built-in reduction modes only so far; reduction=custom (a trainer rule "
                "or your own callable) counts and reduces over groups of all W ranks and its hooks see every "
                "micro-batch on every rank, which the pipeline splits over its stages: use pp=1 with it",
            )
        )
    if cfg.sp > 1:
        found.append(
            (
                "sp",
                f"sp={cfg.sp} with pp={pp}: Ulysses sequence parallelism inside a pipeline stage is not built yet; "
                "use sp=1 with pp>1",
            )
        )
    if cfg.tp > 1:
        found.append(
            (
                "tp",
                f"tp={cfg.tp} with pp={pp}: tensor parallelism inside a pipeline stage is not built yet; "
                "use tp=1 with pp>1",
            )
        )
    if cfg.objective.name.value == "pg":
        found.append(
            (
                "objective",
                f"objective=pg with pp={pp}: the pipeline schedule splits the targets into pipeline micro-batches, "
                "not the per-token advantages beside them; use objective=ce with pp>1",
            )
        )
    if cfg.cost.modes:
        modes = [mode.value for mode in cfg.cost.modes]
        found.append(
            (
                "cost.modes",
                f"cost.modes={modes} with pp={pp}: the cost job's interleaved loop is not pipelined yet; "
                "use cost.modes=[] (a training job) or pp=1",
            )
        )
    if cfg.model.tie_embeddings:
        found.append(
            (
                "model.tie_embeddings",
                f"model.tie_embeddings=true with pp={pp}: the embedding lives on the first stage and the head on the "
                "last, so one tied weight cannot be on both; use model.tie_embeddings=false",
            )
        )
    layers = shape.layers if shape is not None and shape.layers else cfg.model.n_layers
    if layers < pp:
        valid = ", ".join(str(d) for d in divisors(cfg.world_size) if d <= layers)
        found.append(
            (
                "pp",
                f"pp={pp} stages need at least one layer each, and model.n_layers={layers}; valid pp (divisors of "
                f"world_size={cfg.world_size} up to {layers}): {valid}, or raise model.n_layers to {pp} or more",
            )
        )
    return found + _schedule_problems(cfg)
