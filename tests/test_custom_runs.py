"""End to end: the all-reduce axis and a custom callable as real `python -m runner` sweeps, then the analysis.

`reduction=sum autograd_all_reduce=funcol,torch_nn,identity` must give grad L for funcol and torch_nn
and grad L / W for identity, as `local`, which runs in a second sweep beside a callable written in the
working directory (a per-rank token mean: a common bug) as `reduction=custom`. Analysed together,
they land in one group with the funcol `sum` as reference, and each gets the verdict its math gives.
(`reduction=sum,local autograd_all_reduce=...` would run the same, with `local` thrice: the axis does
not apply to it.)
"""

from __future__ import annotations

import pandas as pd
import pytest
from helpers import run_module

STEPS = 4
PER_RANK_MEAN = '''
import torch.nn.functional as F


def per_rank_token_mean(logits, labels, ctx):
    """Each rank divides by its own valid tokens; FSDP averages the ranks."""
    summed = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum", ignore_index=-100)
    return summed / ctx.rank_tokens
'''


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    root = tmp_path_factory.mktemp("custom_runs")
    (root / "my_reductions.py").write_text(PER_RANK_MEAN)
    common = [f"train.steps={STEPS}", "wandb.mode=disabled"]
    axis = root / "axis"
    done = run_module(
        "runner",
        [
            "-m",
            "reduction=sum",
            "autograd_all_reduce=funcol,torch_nn,identity",
            *common,
            f"hydra.sweep.dir={axis}",
        ],
        root,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    custom = root / "custom"
    fn = ["reduction=local,custom", "custom.fn=my_reductions:per_rank_token_mean", "custom.expect=different"]
    done = run_module("runner", ["-m", *fn, *common, f"hydra.sweep.dir={custom}"], root, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    checked = run_module(
        "analysis", [str(axis), str(custom), "--check", "--no-plots", "--wandb", "disabled"], root, timeout=600
    )
    verdicts = pd.read_csv(axis / "analysis-combined" / "verdicts.csv")
    return checked, verdicts


@pytest.mark.slow
def test_funcol_and_torch_nn_give_grad_L_and_identity_grad_L_over_W(analysed):
    checked, verdicts = analysed
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert verdicts["group"].nunique() == 1
    by_mode = verdicts.groupby("reduction")["verdict_text"].agg(set).to_dict()
    assert by_mode["sum"] == {"reference"}
    assert by_mode["sum[torch_nn]"] <= {"identical", "equivalent"}
    assert by_mode["sum[identity]"] == {"rescaled ×1/2"}
    assert by_mode["local"] == {"rescaled ×1/2"}
    identity = verdicts[verdicts["reduction"] == "sum[identity]"].iloc[0]
    local = verdicts[verdicts["reduction"] == "local"].iloc[0]
    assert identity["factor"] == pytest.approx(local["factor"], rel=1e-5)  # the same gradient as local's
    assert "check: all 5 verdicts are as expected" in checked.stdout


@pytest.mark.slow
def test_a_callable_from_the_working_directory_gets_the_verdict_its_math_gives(analysed):
    _, verdicts = analysed
    custom = verdicts[verdicts["reduction"] == "custom:my_reductions:per_rank_token_mean [FSDP mean]"].iloc[0]
    assert custom["baseline"] == verdicts.loc[verdicts["verdict"] == "reference", "run"].iloc[0]
    assert (custom["verdict"], custom["expected"], bool(custom["as_expected"])) == ("different", "different", True)
    assert custom["sketch_cos_step1"] < 1 - 1e-4  # padded documents: the ranks' token counts differ
