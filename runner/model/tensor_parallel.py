"""Tensor parallelism of the runner's decoder (`tp` > 1): Megatron-style column/row-parallel blocks.

The plan is torchtitan's for Llama 3 (pytorch/torchtitan,
torchtitan/models/llama3/infra/parallelize.py `apply_tp` at
018740b7aae7846d24954539244c78215dbd181f), without loss parallelism: the
embedding row-parallel with its output sharded over the sequence, the norms
sequence-parallel, in each block wq/wk/wv and w_gate/w_up column-parallel and
wo/w_down row-parallel (their partial sums reduce-scattered back onto the
sequence), and the LM head column-parallel with its logits gathered
(`Replicate()`), so every tp rank holds the whole logits of its tokens.

Notation as in `runner.train.reduction`, with T = tp and W = dp * sp * T.
The T ranks of one tensor-parallel group hold the same rows and columns of
the batch, so each computes the same S_rsm and n_rsm, and the loss it
backpropagates is one copy of L_rsm: DTensor's collectives inside the group
(the all-gathers before the column-parallel layers, the reduce-scatters after
the row-parallel ones) give each rank its slice of d(L_rsm)/dθ, the
partial sums of the replicated norms' gradients included. So the loss
collectives and N run over the data ranks alone (dp x sp = W / T, the
`loss_group` of `runner.model.parallel`), and FSDP's mean over those W / T
ranks leaves each mode the factor it has at tp = 1 with W replaced by W / T
(sum: dL; local: dL / (W / T)). Counting N over all W ranks would count each
token T times: every gradient / T, a bug the tool can show, not one it makes.
"""

from __future__ import annotations

import warnings

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

# FSDP warns once that the root's output is a view (the gathered logits are DTensor.to_local()'s alias): an
# in-place op on it would skip FSDP's pre-backward hook. The loss (`runner.train.reduction`) only reads them.
_LOGITS_VIEW_WARNING = r"FSDP2-wrapped module \(\w+\) returned a view tensor"


def _block_plan() -> dict:
    """One block's plan: its inputs gathered from the sequence shards before the column-parallel layers."""
    gather = dict(input_layouts=(Shard(1), None, None, None), desired_input_layouts=(Replicate(), None, None, None))
    return {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(**gather),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "ffn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "ffn.w_gate": ColwiseParallel(),
        "ffn.w_up": ColwiseParallel(),
        "ffn.w_down": RowwiseParallel(output_layouts=Shard(1)),
    }


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, loss_parallel: bool = False) -> nn.Module:
    """The decoder's parameters as DTensors over `tp_mesh` (in place): its logits gathered on every tp rank, or
    with `loss_parallel` left sharded over the vocabulary (a DTensor, for torch's `loss_parallel()`)."""
    warnings.filterwarnings("ignore", message=_LOGITS_VIEW_WARNING, category=UserWarning)
    parallelize_module(
        model,
        tp_mesh,
        {
            "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "head": ColwiseParallel(
                input_layouts=Shard(1),
                output_layouts=Shard(-1) if loss_parallel else Replicate(),
                use_local_output=not loss_parallel,
            ),
        },
    )
    for block in model.blocks:
        parallelize_module(block, tp_mesh, _block_plan())
    return model
