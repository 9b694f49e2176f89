"""The parts of one rank that both loops build: model, data, optimizer and loss reducers.

Training (`runner.train.loop`) and the cost measurement (`runner.measure.cost`)
get them from `build_parts`, step the optimizer with `runner.train.optim.optimizer_step`
and stop on `runner.train.outcome.divergence`, so the two loops cannot drift apart.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from runner.config import Objective, RunConfig
from runner.data.batches import Batch, GlobalBatches, load_documents, local_micro_batches, packing_separator
from runner.data.responses import ResponseBatches
from runner.layout import ParallelLayout
from runner.model.parallel import Meshes, parallelize
from runner.model.pipeline_parallel import DecoderStage
from runner.model.registry import build_model
from runner.modes import ALL_REDUCE_BACKWARD, AutogradAllReduce, Reduction, fsdp_reduction_of, has_graph_all_reduce
from runner.train.gradients import NormFn
from runner.train.optim import build_optimizer, lr_at, set_lr
from runner.train.pipeline_step import PipelineStep
from runner.train.reduction import LossReducer, StepLoss, forward_backward


@dataclass
class RankParts:
    cfg: RunConfig
    layout: ParallelLayout
    meshes: Meshes
    device: torch.device
    batches: GlobalBatches | ResponseBatches
    model: nn.Module  # sharded with FSDP2, its gradient reduction set for `cfg.reduction` (or `custom.fsdp_reduce`)
    optimizer: torch.optim.Optimizer
    pipeline: PipelineStep | None = None  # pp > 1: `model` is this rank's stage, run by the pipeline's schedule

    def forward_backward(self, micro_batches: list[Batch], reducer: LossReducer) -> StepLoss:
        """One optimizer step's gradients on this rank, accumulated over its micro-batches."""
        if self.pipeline is not None:
            return self.pipeline.forward_backward(micro_batches, reducer)
        return forward_backward(self.model, micro_batches, reducer, self.device)

    def grad_norm(self, reducer: LossReducer) -> NormFn | None:
        """The norm clipping uses: a trainer's own (a custom rule's hook), the norm over every pipeline stage,
        or None: DTensor's over the data ranks."""
        own = reducer.grad_norm()
        if own is None and self.pipeline is not None:
            return self.pipeline.grad_norm
        return own

    @property
    def group(self) -> dist.ProcessGroup:
        """All W ranks (FSDP's group and the loss collectives' where tp = 1; the loss's: `meshes.loss_group`)."""
        return self.meshes.world_group

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    def local_share(self, batch: Batch) -> list[Batch]:
        """This rank's share of a global batch: its dp rows, in grad_accum micro-batches, its sp columns."""
        return local_micro_batches(
            batch,
            dp=self.layout.dp,
            dp_rank=self.meshes.dp_rank,
            sp=self.layout.sp,
            sp_rank=self.meshes.sp_rank,
            grad_accum=self.cfg.grad_accum,
        )

    def set_lr(self, step: int) -> float:
        """The schedule's learning rate for `step`, set on the optimizer; returns it."""
        lr = lr_at(step, self.cfg.optim)
        set_lr(self.optimizer, lr)
        return lr

    def reducer(self, mode: Reduction) -> LossReducer:
        cfg = self.cfg
        if mode is Reduction.custom:
            from runner.callables import resolve_callable
            from runner.train.custom import CustomReducer
            from runner.train.custom_rule import CONFIGURED

            fn = resolve_callable(cfg.custom.fn)
            # ctx.all_reduce uses autograd_all_reduce for a rule that declares graph_all_reduce="configured"; the
            # launcher refuses the key for any other rule (`runner.sweep.ignored`).
            configured = getattr(fn, "graph_all_reduce", None) == CONFIGURED
            all_reduce = cfg.autograd_all_reduce if configured else AutogradAllReduce.funcol
            return CustomReducer(
                fn,
                cfg.custom.fn,
                self.meshes,
                cfg.grad_accum,
                autograd_all_reduce=all_reduce,
                timeout_s=cfg.dist.timeout_s,
                objective=cfg.objective if cfg.objective.name is Objective.pg else None,
                sequences=cfg.train.global_batch,
            )
        # Only a mode with an all-reduce in its graph reads autograd_all_reduce (`runner.sweep.ignored`).
        all_reduce = cfg.autograd_all_reduce if has_graph_all_reduce(mode) else AutogradAllReduce.funcol
        group = self.meshes.loss_group  # the data ranks: the tp ranks of a group hold the same tokens
        return LossReducer(mode, group, cfg.grad_accum, sp=self.layout.sp, autograd_all_reduce=all_reduce)

    def graph_all_reduce(self) -> AutogradAllReduce | None:
        """The differentiable all-reduce in this run's graph: `sum`'s `autograd_all_reduce`, or the one a custom
        rule declares (`runner.train.custom_rule`); None: there is none."""
        cfg = self.cfg
        if cfg.reduction is Reduction.custom:
            from runner.callables import resolve_callable
            from runner.train.custom_rule import graph_all_reduce_of

            return graph_all_reduce_of(resolve_callable(cfg.custom.fn), lambda: cfg.autograd_all_reduce)
        return cfg.autograd_all_reduce if has_graph_all_reduce(cfg.reduction) else None

    def provenance(self) -> dict:
        """summary.json's record of the code this run's gradient rests on (collective: every rank calls it):
        `dropout`, what of the model draws at random (`runner.train.rng.dropout_in`; None: nothing),
        `all_reduce_backward`, the graph's all-reduce's backward as measured here at the start, and for a
        custom rule `custom_upstream`, the packages (with the versions that ran) and sources it follows, and
        `custom_sources_ran`, the sha256 of each of the user's modules as this rank imported them."""
        from runner.train.all_reduce import measured_backward
        from runner.train.rng import dropout_in

        facts = {"dropout": dropout_in(self.model)}
        implementation = self.graph_all_reduce()
        if implementation is not None:
            expected = float(self.layout.data_ranks) if ALL_REDUCE_BACKWARD[implementation] == "sum" else 1.0
            group = self.meshes.loss_group
            facts["all_reduce_backward"] = measured_backward(implementation, group, self.device, expected)
        if self.cfg.reduction is Reduction.custom:
            from runner.callables import local_sources, resolve_callable
            from runner.train.upstream import upstream_records

            facts["custom_upstream"] = upstream_records(resolve_callable(self.cfg.custom.fn))
            facts["custom_sources_ran"] = local_sources(list(sys.modules))  # the rule's files as imported here
        return facts


def global_batches(cfg: RunConfig) -> GlobalBatches | ResponseBatches:
    """Each step's global batch, from (seed, step) alone: the documents' targets (objective=ce), or prompts and
    responses with advantages (objective=pg, `runner.data.responses`)."""
    documents = load_documents(cfg.data)
    train = cfg.train
    if cfg.objective.name is Objective.pg:
        return ResponseBatches(
            documents,
            cfg.objective,
            seq_len=train.seq_len,
            global_batch=train.global_batch,
            seed=cfg.seed,
            separator=packing_separator(cfg.data),
        )
    return GlobalBatches(
        documents,
        seq_len=train.seq_len,
        global_batch=train.global_batch,
        seed=cfg.seed,
        packing=cfg.data.packing,
        separator=packing_separator(cfg.data),
        valid_tokens=cfg.data.valid_tokens,
    )


def build_parts(cfg: RunConfig, meshes: Meshes, device: torch.device) -> RankParts:
    """The data, the seed-initialised model sharded for `cfg.reduction`, and its optimizer."""
    batches = global_batches(cfg)
    custom = cfg.reduction is Reduction.custom  # custom.* is read by a custom run only
    fsdp_reduction = fsdp_reduction_of(cfg.reduction, cfg.custom.fsdp_reduce.value if custom else "mean")
    model = build_model(cfg.model, cfg.seed).to(device)
    if meshes.pp is not None:  # this rank's stage only, its parameters named as in the whole model
        model = DecoderStage(model, meshes.pp.get_local_rank(), meshes.pp.size())
    loss_parallel = cfg.tp > 1 and cfg.loss_parallel  # read with tp > 1 only (`runner.sweep.ignored`)
    model = parallelize(model, meshes, fsdp_reduction, cfg.mp, loss_parallel=loss_parallel)
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    pipeline = PipelineStep(model, meshes, cfg, device) if meshes.pp is not None else None
    return RankParts(cfg, ParallelLayout.from_config(cfg), meshes, device, batches, model, optimizer, pipeline)
