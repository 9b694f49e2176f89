"""Injected faults (`fault.kind`, `fault.rank`, `fault.step`): how the runner's failure handling is tested.

The fault strikes rank `fault.rank` at optimizer step `fault.step`: `raise`,
`exit`, `kill` and `hang` before the step's first collective, `nan` after its
backward (the gradient norm, reduced over the world, is then NaN on every
rank, so every rank stops at that step as diverged).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch

from runner.config import FaultConfig

EXIT_CODE = 3


class InjectedFault(RuntimeError):
    pass


def _strikes(fault: FaultConfig, kind: str, rank: int, step: int) -> bool:
    return fault.kind == kind and fault.rank == rank and fault.step == step


def before_step(fault: FaultConfig, rank: int, step: int) -> None:
    if _strikes(fault, "raise", rank, step):
        raise InjectedFault(f"fault.kind=raise injected on rank {rank} at step {step}")
    if _strikes(fault, "exit", rank, step):
        sys.stdout.flush()
        os._exit(EXIT_CODE)
    if _strikes(fault, "kill", rank, step):
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if _strikes(fault, "hang", rank, step):
        print(f"fault.kind=hang: rank {rank} stops responding at step {step}", flush=True)
        while True:
            time.sleep(60)


def after_backward(fault: FaultConfig, rank: int, step: int, model: torch.nn.Module) -> None:
    if _strikes(fault, "nan", rank, step):
        with torch.no_grad():
            for param in model.parameters():
                if param.grad is not None:
                    param.grad.fill_(float("nan"))
