"""The smallest correct FSDP2 training loop for `sum`: what the runner's harness is measured against (B1).

Same model, data, optimizer and world as the runner's `sum` job, and nothing
else: no collective counter, gradient sketch, world timing, metrics file or
W&B. The loss math is the runner's `sum` (`runner.train.reduction`), written out:

    N = all_reduce(valid targets of this rank's micro-batches)
    per micro-batch: backward(all_reduce_autograd(S_rm / N))   # FSDP2 averages over W: grad L
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from omegaconf import DictConfig

from runner.data.batches import GlobalBatches, load_documents, local_micro_batches
from runner.model.parallel import Meshes, parallelize
from runner.model.registry import build_model
from runner.modes import facts
from runner.train.optim import build_optimizer, lr_at, set_lr
from runner.train.reduction import token_loss_sum


class BareLoop:
    def __init__(self, cfg: DictConfig, meshes: Meshes, device: torch.device):
        self.cfg, self.device, self.group = cfg, device, meshes.world_group
        self.share = dict(
            dp=meshes.world["dp"].size(), dp_rank=meshes.dp_rank, sp=1, sp_rank=0, grad_accum=cfg.grad_accum
        )
        self.batches = GlobalBatches(
            load_documents(cfg.data),
            seq_len=cfg.train.seq_len,
            global_batch=cfg.train.global_batch,
            seed=cfg.seed,
            packing=cfg.data.packing,
        )
        self.model = parallelize(
            build_model(cfg.model, cfg.seed).to(device), meshes, facts(cfg.reduction).fsdp_reduction, cfg.mp
        )
        self.optimizer = build_optimizer(self.model.parameters(), cfg.optim)

    def step(self, step: int) -> None:
        micro_batches = local_micro_batches(self.batches(step), **self.share)
        set_lr(self.optimizer, lr_at(step, self.cfg.optim))
        valid = torch.tensor(sum(mb.valid_tokens for mb in micro_batches), device=self.device)
        dist.all_reduce(valid, group=self.group)
        for micro in micro_batches:
            logits = self.model(micro.inputs.to(self.device))
            loss = token_loss_sum(logits, micro.labels.to(self.device)) / valid
            funcol.all_reduce(loss, "sum", self.group).backward()
        if self.cfg.optim.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
