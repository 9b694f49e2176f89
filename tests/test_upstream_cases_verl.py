"""verl's own unit tests of `agg_loss`, their inputs and expected values fed to the project's paraphrase
(runner/trainers/verl.py `paraphrased_agg_loss`), and to verl's `agg_loss` too where verl imports.

Upstream: verl-project/verl at 1dda039b9c6311889a9c9a26040677e1254814f9 (the commit runner/trainers/verl.py
paraphrases), tests/trainer/ppo/test_loss_aggregation_on_cpu.py (added by 4730d46b1cb6, PR #7197, the only
upstream test that calls `agg_loss` itself: token-sum), and tests/trainer/ppo/test_value_loss_normalization_on_cpu.py
(the other modes, through `compute_value_loss`; only its `agg_loss` half is carried over, see there).
"""

from __future__ import annotations

import pytest
import torch

from runner.trainers import verl as rules

UPSTREAM = "verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9"
FUNCTIONS = [rules.paraphrased_agg_loss] + ([rules.verl_agg_loss] if rules.verl_agg_loss is not None else [])
IDS = ["paraphrase", "verl"][: len(FUNCTIONS)]
agg = pytest.mark.parametrize("agg_loss", FUNCTIONS, ids=IDS)


@agg
def test_token_sum_masks_tokens_and_scales_for_dp(agg_loss):
    """UPSTREAM tests/trainer/ppo/test_loss_aggregation_on_cpu.py::test_token_sum_masks_tokens_and_scales_for_dp."""
    loss_mat = torch.tensor([[1.0, 2.0, 30.0], [4.0, 50.0, 6.0]])
    loss_mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    loss = agg_loss(loss_mat, loss_mask, loss_agg_mode="token-sum", dp_size=4)
    assert loss.item() == pytest.approx((1.0 + 2.0 + 4.0 + 6.0) * 4)


@agg
@pytest.mark.parametrize("num_micro_batches", [1, 2, 4])
def test_token_sum_is_microbatch_invariant(agg_loss, num_micro_batches):
    """UPSTREAM tests/trainer/ppo/test_loss_aggregation_on_cpu.py::test_token_sum_is_microbatch_invariant
    (the whole batch's 192 = sum of columns 0 and 1 of arange(1, 25).reshape(8, 3) is ours, not upstream's)."""
    loss_mat = torch.arange(1, 25, dtype=torch.float32).reshape(8, 3)
    loss_mask = torch.tensor([[1.0, 1.0, 0.0]] * 8)
    step = loss_mat.shape[0] // num_micro_batches
    accumulated = sum(
        agg_loss(loss_mat[i : i + step], loss_mask[i : i + step], loss_agg_mode="token-sum")
        for i in range(0, loss_mat.shape[0], step)
    )
    whole = agg_loss(loss_mat, loss_mask, loss_agg_mode="token-sum")
    torch.testing.assert_close(accumulated, whole)
    assert whole.item() == 192.0


@agg
@pytest.mark.parametrize("dp_size", [2, 4])
def test_token_sum_matches_global_sum_after_fsdp_mean_reduction(agg_loss, dp_size):
    """UPSTREAM tests/trainer/ppo/test_loss_aggregation_on_cpu.py::
    test_token_sum_matches_global_sum_after_fsdp_mean_reduction."""
    loss_mat = torch.arange(1, 25, dtype=torch.float32).reshape(8, 3)
    loss_mask = torch.tensor([[1.0, 1.0, 0.0]] * 8)
    rank_step = loss_mat.shape[0] // dp_size
    rank_losses = [
        agg_loss(loss_mat[i : i + rank_step], loss_mask[i : i + rank_step], loss_agg_mode="token-sum", dp_size=dp_size)
        for i in range(0, loss_mat.shape[0], rank_step)
    ]
    fsdp_reduced = torch.stack(rank_losses).mean()
    torch.testing.assert_close(fsdp_reduced, agg_loss(loss_mat, loss_mask, loss_agg_mode="token-sum"))


# UPSTREAM tests/trainer/ppo/test_value_loss_normalization_on_cpu.py pins, for each loss_agg_mode, that
# `compute_value_loss` -> `agg_loss` with the global batch information is invariant to the micro-batch
# split. The invariance is agg_loss's: the per-token loss matrix it is given does not enter it. The
# project paraphrases agg_loss, not compute_value_loss, so these feed agg_loss upstream's masks, lengths,
# splits and keyword arguments, with a loss matrix of upstream's shape drawn from its generator (seed 0,
# its first draw, upstream's `vpreds`), not the clipped value loss computed from it.
MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"]


def value_batch(batch_size, resp_len, lengths=None):
    """UPSTREAM `_make_value_batch`'s shapes and masks (seed 0)."""
    loss_mat = torch.randn(batch_size, resp_len, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(batch_size, resp_len)
    if lengths is not None:
        mask = (torch.arange(resp_len)[None, :] < torch.tensor(lengths)[:, None]).float()
    return loss_mat, mask


def global_kwargs(mask, mode, dp_size=1):
    """UPSTREAM `_global_kwargs`."""
    return {
        "loss_agg_mode": mode,
        "dp_size": dp_size,
        "batch_num_tokens": int(mask.sum()),
        "global_batch_size": mask.shape[0],
    }


def accumulate(agg_loss, loss_mat, mask, num_micro_batches, **kwargs):
    step = mask.shape[0] // num_micro_batches
    return sum(agg_loss(loss_mat[i : i + step], mask[i : i + step], **kwargs) for i in range(0, mask.shape[0], step))


@agg
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_micro_batches", [1, 2, 4])
def test_microbatch_invariant_all_modes(agg_loss, mode, num_micro_batches):
    """UPSTREAM test_value_loss_normalization_on_cpu.py::test_value_loss_microbatch_invariant_all_modes."""
    loss_mat, mask = value_batch(8, 10)
    kwargs = global_kwargs(mask, mode)
    whole = agg_loss(loss_mat, mask, **kwargs)
    torch.testing.assert_close(accumulate(agg_loss, loss_mat, mask, num_micro_batches, **kwargs), whole)


@agg
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
@pytest.mark.parametrize("num_micro_batches", [2, 4])
def test_microbatch_invariant_variable_length(agg_loss, mode, num_micro_batches):
    """UPSTREAM test_value_loss_normalization_on_cpu.py::test_value_loss_microbatch_invariant_variable_length."""
    loss_mat, mask = value_batch(8, 12, lengths=[12, 7, 3, 11, 5, 9, 2, 6])
    kwargs = global_kwargs(mask, mode)
    whole = agg_loss(loss_mat, mask, **kwargs)
    torch.testing.assert_close(accumulate(agg_loss, loss_mat, mask, num_micro_batches, **kwargs), whole)


@agg
@pytest.mark.parametrize("dp_size", [2, 4])
def test_dp_size_matches_global_mean_after_fsdp_reduce(agg_loss, dp_size):
    """UPSTREAM test_value_loss_normalization_on_cpu.py::test_value_loss_dp_size_matches_global_mean_after_fsdp_reduce
    (token-mean, compute_value_loss's default mode)."""
    loss_mat, mask = value_batch(8, 10)
    tokens = int(mask.sum())
    truth = agg_loss(loss_mat, mask, "token-mean", batch_num_tokens=tokens)
    step = 8 // dp_size
    ranks = [
        agg_loss(loss_mat[i : i + step], mask[i : i + step], "token-mean", dp_size=dp_size, batch_num_tokens=tokens)
        for i in range(0, 8, step)
    ]
    torch.testing.assert_close(torch.stack(ranks).mean(), truth)


@agg
def test_loss_scale_factor_is_forwarded(agg_loss):
    """UPSTREAM test_value_loss_normalization_on_cpu.py::test_loss_scale_factor_is_forwarded: halving
    loss_scale_factor doubles the seq-mean-token-sum-norm loss."""
    loss_mat, mask = value_batch(8, 10)
    common = {"loss_agg_mode": "seq-mean-token-sum-norm", "global_batch_size": 8}
    torch.testing.assert_close(
        agg_loss(loss_mat, mask, loss_scale_factor=5, **common),
        2 * agg_loss(loss_mat, mask, loss_scale_factor=10, **common),
    )


@agg
@pytest.mark.parametrize("num_micro_batches", [2, 4])
def test_without_global_info_is_microbatch_dependent(agg_loss, num_micro_batches):
    """UPSTREAM test_value_loss_normalization_on_cpu.py::test_value_loss_without_global_info_is_microbatch_dependent:
    token-mean over each micro-batch's own tokens accumulates to num_micro_batches x the whole batch's."""
    loss_mat, mask = value_batch(8, 10)
    whole = agg_loss(loss_mat, mask, "token-mean")
    accum = accumulate(agg_loss, loss_mat, mask, num_micro_batches, loss_agg_mode="token-mean")
    torch.testing.assert_close(accum, num_micro_batches * whole)
    assert not torch.allclose(accum, whole)
