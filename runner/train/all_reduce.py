"""The differentiable all-reduce of a loss, in the three implementations of `autograd_all_reduce`.

Every implementation returns y = sum_r x_r on every rank of the group. They
differ in the backward, that is in what reaches each rank's x_r when every
rank seeds its own y with 1 (`loss.backward()`):

| implementation | what it is                                             | backward of dy         | dy/dx_r seen by x_r |
|----------------|--------------------------------------------------------|------------------------|---------------------|
| funcol         | torch.distributed._functional_collectives.all_reduce   | all-reduce(dy), SUM    | W                   |
| torch_nn       | torch.distributed.nn.functional.all_reduce (xtuner's)   | all-reduce(dy), SUM    | W                   |
| identity       | forward SUM, backward dy unchanged (Megatron's          | dy                     | 1                   |
|                | `_ReduceFromModelParallelRegion` in tensor_parallel/mappings.py) |               |                     |

FSDP2 then averages the parameter gradients over the W ranks: a SUM backward
gives (1/W) * W * dL = dL, an identity backward (1/W) * dL, the gradient of
`local`, which has no collective at all. So with an identity backward the
collective changes the forward value only. tests/test_all_reduce.py measures
each backward in a gloo world, and every run with an all-reduce in its graph
measures the chosen one's once at its start (`measured_backward`, recorded in
summary.json), so a torch whose backward differs is caught, not assumed.

`torch.distributed.nn.functional.all_reduce` warns (FutureWarning) on every
call in torch 2.13. The first warning goes through (the rank's log shows it
once, and the launcher echoes it once per sweep); after it the warning is
ignored in this process (`quiet_torch_nn_deprecation`), since any later change
to the warning filters would show it again on every micro-batch.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from runner.modes import AutogradAllReduce

TORCH_NN_DEPRECATION = r"torch\.distributed\.nn\.functional\.\w+ is deprecated"
_quieted = False


def quiet_torch_nn_deprecation() -> None:
    """Ignore torch.distributed.nn.functional's deprecation warning in this process from now on (once)."""
    global _quieted
    if not _quieted:
        warnings.filterwarnings("ignore", message=TORCH_NN_DEPRECATION, category=FutureWarning)
        _quieted = True


class _SumForwardIdentityBackward(torch.autograd.Function):
    """Megatron's rule for reducing out of a model-parallel region: all-reduce forward, pass-through backward."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        reduced = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM, group=group)
        return reduced

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return grad_output, None


def _torch_nn(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    from torch.distributed.nn.functional import all_reduce

    reduced = all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)  # the first call's warning is shown
    quiet_torch_nn_deprecation()
    return reduced


def differentiable_all_reduce(
    tensor: torch.Tensor, group: dist.ProcessGroup, implementation: AutogradAllReduce = AutogradAllReduce.funcol
) -> torch.Tensor:
    """sum_r tensor_r on every rank, with the backward of `implementation` (the table above)."""
    if implementation is AutogradAllReduce.funcol:
        return funcol.all_reduce(tensor, "sum", group)
    if implementation is AutogradAllReduce.torch_nn:
        return _torch_nn(tensor, group)
    if implementation is AutogradAllReduce.identity:
        return _SumForwardIdentityBackward.apply(tensor, group)
    raise ValueError(f"autograd_all_reduce={implementation}: valid: {', '.join(a.value for a in AutogradAllReduce)}")


def measured_backward(
    implementation: AutogradAllReduce, group: dist.ProcessGroup, device: torch.device, expected: float
) -> dict:
    """What `implementation`'s backward gives a 1-element input on each rank when every rank seeds 1 (W for a SUM
    backward, 1 for identity), measured here once; for summary.json's `all_reduce_backward`. Collective: every
    rank of `group` calls it."""
    seed = torch.ones(1, device=device, requires_grad=True)
    differentiable_all_reduce(seed, group, implementation).backward(torch.ones(1, device=device))
    quiet_torch_nn_deprecation()
    factors = [torch.zeros(1, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(factors, seed.grad.detach(), group=group)
    per_rank = [factor.item() for factor in factors]
    return {
        "implementation": implementation.value,
        "factor": per_rank[0],
        "per_rank": per_rank,
        "expected": expected,
        "as_expected": all(factor == expected for factor in per_rank),
        "torch": torch.__version__,
    }
