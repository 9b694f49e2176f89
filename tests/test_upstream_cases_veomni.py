"""VeOmni's own tests of `_local_pth_sum` (each local gradient shard's norm ** p, summed in float32), their
inputs and expected values fed to the project's paraphrase at p = 2, `_local_squares` in
runner/trainers/veomni_grad_norm.py.

Upstream: ByteDance-Seed/VeOmni, tests/utils/test_fsdp2_clip_grad_norm.py, at
3506c435421fec0b5f799524f4f81141a0970fc5 (PR #862's merge, the commit the paraphrase's AFTER reads, where
the file was added) and at 46a59d6ba2fcaaa4dbf5d960217a9d56b1a96159 (its one later change, which added the
bfloat16 / float64 / dtype cases). Upstream passes parameters and skips those with no gradient; the runner
passes `_local_squares` the gradients that exist (runner/train/gradients.py `clip_gradients`), which is the
adapter here. Upstream's chunk-size and no-foreach variants exercise VeOmni's own code paths (chunking, a
fallback) that the paraphrase does not have; their inputs and expected 169 are those of the first test.
"""

from __future__ import annotations

import pytest
import torch

from runner.trainers.veomni_grad_norm import _local_squares


def local_pth_sum(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """`_local_pth_sum(params, p=2.0)` through the paraphrase: the gradients that exist, as the runner passes them."""
    return _local_squares([p.grad for p in params if p.grad is not None], torch.device("cpu"))


def test_local_pth_sum_skips_missing_grads_and_accumulates_in_fp32():
    """3506c435 test_local_pth_sum_skips_missing_grads_and_accumulates_in_fp32 (and, same inputs and value,
    test_local_pth_sum_falls_back_without_foreach_support)."""
    p1 = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    p2 = torch.nn.Parameter(torch.tensor([3.0]))
    p3 = torch.nn.Parameter(torch.tensor([5.0]))
    p1.grad = torch.tensor([3.0, 4.0])
    p2.grad = None
    p3.grad = torch.tensor([12.0])
    actual = local_pth_sum([p1, p2, p3])
    assert actual.dtype == torch.float32
    assert torch.equal(actual.cpu(), torch.tensor(169.0))


def test_local_pth_sum_accumulates_bfloat16_gradients_in_fp32():
    """46a59d6b test_local_pth_sum_accumulates_bfloat16_gradients_in_fp32."""
    p1 = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.bfloat16))
    p2 = torch.nn.Parameter(torch.tensor([3.0], dtype=torch.bfloat16))
    p1.grad = torch.tensor([3.0, 4.0], dtype=torch.bfloat16)
    p2.grad = torch.tensor([12.0], dtype=torch.bfloat16)
    actual = local_pth_sum([p1, p2])
    assert actual.dtype == torch.float32
    assert torch.equal(actual.cpu(), torch.tensor(169.0))


def test_local_pth_sum_supports_float64_gradients():
    """46a59d6b test_local_pth_sum_supports_float64_gradients."""
    param = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    param.grad = torch.tensor([3.0, 4.0], dtype=torch.float64)
    actual = local_pth_sum([param])
    assert actual.dtype == torch.float32
    assert torch.equal(actual.cpu(), torch.tensor(25.0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_local_pth_sum_matches_previous_fp32_conversion(dtype):
    """46a59d6b test_local_pth_sum_matches_previous_fp32_conversion, at p = 2 (the paraphrase's only p; upstream
    also runs 1 and 3.5). Its expected value: each gradient in float32, its norm ** 2, summed."""
    params = [torch.nn.Parameter(torch.zeros(4, dtype=dtype)), torch.nn.Parameter(torch.zeros(3, dtype=dtype))]
    params[0].grad = torch.tensor([0.25, -1.5, 2.0, -0.75], dtype=dtype)
    params[1].grad = torch.tensor([3.0, -0.5, 1.25], dtype=dtype)
    actual = local_pth_sum(params)
    expected = sum(torch.linalg.vector_norm(param.grad.to(torch.float32), ord=2).pow(2) for param in params)
    assert actual.dtype == torch.float32
    torch.testing.assert_close(actual.cpu(), expected.cpu())
    assert actual.item() == pytest.approx(17.6875)  # ours: every value is exact in float16, the squares sum to 17.6875


# Upstream's `_fsdp_grad_norm_reduce_groups` tests (3506c435, the same file) name, for a parallel state, the
# groups the squares are summed over. The paraphrase reads them off the gradients' DTensor placements
# (`_shard_groups`): the adapter turns each state into the mesh and placements FSDP2 gives it. The cases a
# 2-process world can hold: plain FSDP2 over 2 ranks, HSDP with 2 replicas of 1 shard, and no FSDP2
# (plain tensors). Upstream's HSDP with dp_shard 4 and its sp cases need more ranks: not carried over.
NORM_CASES = {
    "plain_fsdp2": ((2,), ("dp_shard",)),  # test_fsdp_grad_norm_reduce_groups_use_fsdp_group_for_plain_fsdp2
    "replicated_unsharded": ((2, 1), ("dp_replicate", "dp_shard")),  # ..._skip_replicated_unsharded_fsdp2
}


def in_world() -> dict:
    from types import SimpleNamespace

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from runner.trainers import veomni_grad_norm as rules

    full = [torch.tensor([3.0, 4.0, 12.0, 0.0]), torch.tensor([1.0, -2.0])]  # |g|^2 = 169 + 5 = 174
    ctx = SimpleNamespace(device=torch.device("cpu"), world_group=dist.group.WORLD)
    out = {}
    for name, (shape, names) in NORM_CASES.items():
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        placements = [Shard(0)] if len(shape) == 1 else [Replicate(), Shard(0)]
        grads = [distribute_tensor(g, mesh, placements) for g in full]
        groups = rules._shard_groups(grads)
        out[name] = {
            "groups": [sorted(dist.get_process_group_ranks(g)) for g in groups],
            "after": float(rules._over_shard_group(grads, ctx)),
            "before": float(rules._over_fsdp_group(grads, ctx)),
        }
    return out


@pytest.fixture(scope="module")
def norms():
    from gloo_world import run_in_world

    return run_in_world(in_world, 2)


def test_fsdp_grad_norm_reduce_groups_use_fsdp_group_for_plain_fsdp2(norms):
    """3506c435 test_fsdp_grad_norm_reduce_groups_use_fsdp_group_for_plain_fsdp2: one group, every FSDP rank;
    both arms then give the true norm sqrt(174)."""
    for rank in norms:
        case = rank["plain_fsdp2"]
        assert case["groups"] == [[0, 1]]
        assert case["after"] == pytest.approx(174**0.5) and case["before"] == pytest.approx(174**0.5)


def test_fsdp_grad_norm_reduce_groups_skip_replicated_unsharded_fsdp2(norms):
    """3506c435 test_fsdp_grad_norm_reduce_groups_skip_replicated_unsharded_fsdp2: no group. After the fix the
    norm is the replica's own, sqrt(174); before it (fsdp_group, both replicas) sqrt(2 x 174)."""
    for rank in norms:
        case = rank["replicated_unsharded"]
        assert case["groups"] == []
        assert case["after"] == pytest.approx(174**0.5)
        assert case["before"] == pytest.approx((2 * 174) ** 0.5)


def test_fsdp_grad_norm_reduce_groups_skip_non_fsdp2_modes():
    """3506c435 test_fsdp_grad_norm_reduce_groups_skip_non_fsdp2_modes: gradients that are no DTensor, no group."""
    from runner.trainers.veomni_grad_norm import _shard_groups

    assert _shard_groups([torch.ones(3), torch.ones(2)]) == []
