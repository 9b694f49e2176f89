"""Optimizer and learning-rate schedule (linear warmup, then constant).

A constant schedule keeps the ablation about the loss reduction: under SGD a
gradient scaled by 1/W is a learning rate scaled by 1/W; Adam cancels a
constant scale except through eps and clipping.
"""

from __future__ import annotations

import torch

from runner.config import OptimConfig
from runner.train.gradients import NormFn, clip_gradients


def build_optimizer(parameters, cfg: OptimConfig) -> torch.optim.Optimizer:
    if cfg.name.value == "sgd":
        return torch.optim.SGD(parameters, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(
        parameters, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay
    )


def lr_at(step: int, cfg: OptimConfig) -> float:
    """Learning rate of optimizer step `step` (1-based)."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    return cfg.lr


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def optimizer_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, clip: float, norm: NormFn | None = None
) -> tuple[float, float]:
    """Clip to the global grad norm (the runner's, or `norm`: a trainer's own), step, zero the gradients: (the
    norm before clipping, the factor applied)."""
    grad_norm, clip_coef = clip_gradients(model, clip, norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, clip_coef
