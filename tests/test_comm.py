"""The collective counter sees every path a collective can take, with exact calls and bytes."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from gloo_world import run_in_world
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from runner.train.counter import CollectiveCounter

FLOAT = 4  # bytes


def count_known_collectives() -> tuple[dict, dict]:
    warnings.simplefilter("ignore", FutureWarning)  # deprecated c10d names still dispatch the same ops
    group = dist.group.WORLD
    mesh = init_device_mesh("cpu", (2,))
    sharded = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
    leaf = torch.ones(4, requires_grad=True)
    counter = CollectiveCounter()
    with counter:
        dist.all_reduce(torch.ones(10))  # c10d all_reduce: 10 floats
        dist.all_gather_into_tensor(torch.empty(20), torch.ones(10))  # c10d all_gather of a 10-float shard
        dist.reduce_scatter_tensor(torch.empty(5), torch.ones(10))  # c10d reduce_scatter of 10 floats
        funcol.all_reduce(torch.ones(3), "sum", group).wait()  # functional all_reduce: 3 floats
        funcol.all_reduce(leaf, "sum", group).sum().backward()  # forward and backward: 4 floats each
        sharded.full_tensor()  # DTensor: an all_gather of this rank's 4 floats
    first = counter.take()
    return first, counter.take()


def test_counts_every_collective_path():
    for first, after_take in run_in_world(count_known_collectives, 2):
        assert {kind: (c["calls"], c["bytes"]) for kind, c in first.items()} == {
            "all_reduce": (4, (10 + 3 + 4 + 4) * FLOAT),
            "all_gather": (2, (10 + 4) * FLOAT),
            "reduce_scatter": (1, 10 * FLOAT),
        }
        assert all(c["seconds"] > 0 for c in first.values())
        assert after_take == {}  # take() resets
