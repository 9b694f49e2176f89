"""runner/trainers/verl.py: its paraphrase of verl's `agg_loss` against verl's own, where verl imports
(`make setup-verl`; not part of `make setup` or `make test`), and the run's record of which one ran."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from runner.trainers import verl as rules

MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
ARGUMENTS = [
    {},  # the defaults: dp_size 1, counts from the matrix itself (the legacy actor's call)
    {"dp_size": 2, "batch_num_tokens": 57, "global_batch_size": 12},
    {"dp_size": 4, "batch_num_tokens": 211, "global_batch_size": 24, "loss_scale_factor": 96},
]


def test_the_rules_record_the_code_that_ran():
    installed = importlib.util.find_spec("verl") is not None and rules.verl_agg_loss is not None
    record = rules.token_mean.upstream[0].record()
    if installed:
        assert rules.agg_loss is rules.verl_agg_loss
        assert record["package"] == "verl" and record["version"] == "0.9.1"
    else:
        assert rules.agg_loss is rules.paraphrased_agg_loss
        assert record == {
            "repository": "verl-project/verl",
            "commit": rules.COMMIT,
            "files": list(rules.PARAPHRASED.files),
        }


def test_the_paraphrase_refuses_as_verl_does():
    loss_mat, mask = torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="batch_num_tokens is required"):
        rules.paraphrased_agg_loss(loss_mat, mask, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="global_batch_size is required"):
        rules.paraphrased_agg_loss(loss_mat, mask, "seq-mean-token-mean", dp_size=2)
    with pytest.raises(ValueError, match="Invalid loss_agg_mode"):
        rules.paraphrased_agg_loss(loss_mat, mask, "token-median")


@pytest.mark.skipif(
    rules.verl_agg_loss is None,
    reason="verl is not installed here (`make setup-verl` installs it: verl 0.9.1 without its dependencies)",
)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("arguments", ARGUMENTS, ids=["defaults", "dp2", "dp4-scale"])
def test_the_paraphrase_is_verls_agg_loss(mode, arguments):
    generator = torch.Generator().manual_seed(7)
    lengths = torch.tensor([1, 9, 4, 0, 12, 7])  # a fully masked row: excluded from the sequence means
    mask = torch.arange(12)[None, :] < lengths[:, None]
    values = torch.randn(6, 12, generator=generator, dtype=torch.float64)
    got = {}
    for name, function in (("paraphrase", rules.paraphrased_agg_loss), ("verl", rules.verl_agg_loss)):
        loss_mat = values.clone().requires_grad_()
        loss = function(loss_mat, mask, mode, **arguments)
        loss.backward()
        got[name] = (loss.detach(), loss_mat.grad)
    torch.testing.assert_close(got["paraphrase"], got["verl"], rtol=0, atol=0)
